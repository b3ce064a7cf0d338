#!/usr/bin/env python3
"""Converts docs/api/openapi.yaml to a C++ source defining
entente::broker::openapi_json(), the description served at GET /v1/openapi.json.
Fails (and so fails the build) when the YAML does not parse or lacks the
OpenAPI 3 top-level members."""
import json
import sys

import yaml


def main() -> int:
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    for key in ("openapi", "info", "paths"):
        if not isinstance(doc, dict) or key not in doc:
            print(f"{src}: missing top-level '{key}'", file=sys.stderr)
            return 1
    if not str(doc["openapi"]).startswith("3."):
        print(f"{src}: 'openapi' must be 3.x", file=sys.stderr)
        return 1
    text = json.dumps(doc, separators=(",", ":"), sort_keys=False)
    # A raw string literal split into pieces: compilers limit one literal's length.
    pieces = [text[i:i + 8000] for i in range(0, len(text), 8000)] or [""]
    with open(dst, "w", encoding="utf-8") as f:
        f.write("// Generated from docs/api/openapi.yaml by scripts/openapi_to_cpp.py.\n")
        f.write("#include <string_view>\n\nnamespace entente::broker {\n")
        f.write("std::string_view openapi_json() {\n  static constexpr char kText[] =\n")
        for p in pieces:
            f.write('      R"entente_openapi(' + p + ')entente_openapi"\n')
        f.write("      ;\n  return {kText, sizeof(kText) - 1};\n}\n}  // namespace entente::broker\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
