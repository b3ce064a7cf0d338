#!/usr/bin/env python3
"""Converts the dashboard's static files (broker/ui/) to a C++ source defining
entente::broker::ui_asset(name), served at GET /ui/ and /ui/{file}.

Usage: ui_to_cpp.py OUT.cpp FILE...
Each file is served under its base name, with a content type taken from its
extension and an ETag made from its SHA-256, so that a browser revalidates
cheaply and never keeps a file from another build. Fails (and so fails the
build) on an extension it has no content type for."""
import hashlib
import os
import sys

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


def literal(data: bytes) -> str:
    """The bytes as a C++ string literal split into lines (any byte allowed)."""
    lines, line = [], ""
    for b in data:
        line += "\\x%02x" % b
        if len(line) >= 120:
            lines.append('"' + line + '"')
            line = ""
    if line or not lines:
        lines.append('"' + line + '"')
    return "\n      ".join(lines)


def main() -> int:
    dst, srcs = sys.argv[1], sys.argv[2:]
    entries = []
    for src in srcs:
        name = os.path.basename(src)
        ext = os.path.splitext(name)[1]
        if ext not in CONTENT_TYPES:
            print(f"{src}: no content type for '{ext}'", file=sys.stderr)
            return 1
        with open(src, "rb") as f:
            data = f.read()
        etag = '"' + hashlib.sha256(data).hexdigest()[:32] + '"'
        entries.append((name, CONTENT_TYPES[ext], etag, data))
    with open(dst, "w", encoding="utf-8") as f:
        f.write("// Generated from broker/ui/ by scripts/ui_to_cpp.py.\n")
        f.write('#include "broker/detail/ui_assets.h"\n\nnamespace entente::broker {\n')
        f.write("const UiAsset* ui_asset(std::string_view name) {\n")
        f.write("  static const UiAsset kAssets[] = {\n")
        for name, ctype, etag, data in entries:
            etag_lit = etag.replace('"', '\\"')
            f.write(f'      {{"{name}", "{ctype}", "{etag_lit}",\n      std::string_view({literal(data)}, {len(data)})}},\n')
        f.write("  };\n")
        f.write("  for (const auto& a : kAssets)\n    if (a.name == name) return &a;\n  return nullptr;\n}\n")
        f.write("}  // namespace entente::broker\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
