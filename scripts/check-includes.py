#!/usr/bin/env python3
"""Checks the direction of the #include arrows between Entente's modules.

    scripts/check-includes.py [ROOT]

Reads every #include of every .h and .cpp under ROOT (default: the
repository; build*/, out/, docs/, scripts/ and hidden folders skipped), and
prints one line per violation, then exits 1 if there was any:

* an include from module A of module B where the table below does not let A
  use B (docs/architecture.md, "Modules and dependencies": arrows point from
  user to used, one way);
* an include of another module's private header: `M/detail/` (and the
  engine's `boxes/`) belong to M; only M's own files and M's unit tests
  (tests/M/) may include them;
* a private header without its compile-time guard (`#if
  !defined(ENTENTE_IN_M)` ... `#error`), which is what makes the build
  itself refuse such an include (each library defines ENTENTE_IN_M for its
  own sources only);
* a folder with C++ sources that the table does not know: add it to the
  table and to docs/architecture.md first;
* in a folder's CMakeLists.txt, a target_link_libraries of one of our
  library targets (entente_*) that the same table does not allow, so that
  the build graph and the includes say the same.

An include is resolved like the compiler does for this tree: next to the
including file first, then from ROOT (every target's include path). What
resolves to neither is third-party (RapidJSON, Boost, generated headers) and
is not checked, except a quoted include naming one of our modules, which is
checked even if the file is missing.
"""

import os
import re
import sys

# Which module may include which: keep in sync with the picture and the table
# of docs/architecture.md, "Modules and dependencies". A module may always
# include its own headers.
LIBRARIES = ["base", "engine", "store", "net", "certs", "http", "cluster", "contracts", "federation",
             "broker"]
ALLOWED = {
    "base": set(),
    "engine": {"base"},
    "store": {"base"},
    "net": {"base"},  # Asio, OpenSSL; base for Result and OpenSSL errors
    "certs": {"base"},
    "http": {"net", "base"},
    "cluster": {"http", "net", "base"},  # etcd over the HTTP client
    "contracts": {"certs", "store", "engine", "base"},
    "federation": {"contracts", "engine", "store", "certs", "net", "base"},
    "broker": {"federation", "cluster", "http", "contracts", "engine", "store", "certs", "net",
               "base"},
    "bench": set(LIBRARIES),
    "tests": set(LIBRARIES) | {"bench"},
}

# Our library targets, by the module (folder) that defines them.
TARGETS = {"entente_" + m: m for m in LIBRARIES}
TARGETS.update({"entente_version": "broker", "entente_nexmark": "bench",
                "entente_bench_common": "bench", "entente_itest_support": "tests"})

# A module's private folders: their headers are for the module alone.
PRIVATE_DIRS = {"engine": ("detail", "boxes")}
DEFAULT_PRIVATE_DIRS = ("detail",)

# Pairs (including file, private header) let through. Empty: nothing outside
# a module includes its private headers.
EXEMPT = set()

SKIP_DIRS = {"out", "docs", "scripts"}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def module_of(rel):
    return rel.split("/", 1)[0] if "/" in rel else None


def private_owner(rel):
    """The module whose private header `rel` is, or None."""
    parts = rel.split("/")
    if len(parts) < 3 or parts[0] not in LIBRARIES:
        return None
    return parts[0] if parts[1] in PRIVATE_DIRS.get(parts[0], DEFAULT_PRIVATE_DIRS) else None


def may_see_private(including, owner):
    parts = including.split("/")
    return parts[0] == owner or (parts[0] == "tests" and len(parts) > 2 and parts[1] == owner)


def sources(root):
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames
                           if not d.startswith((".", "build")) and d not in SKIP_DIRS]
        for name in filenames:
            if name.endswith((".h", ".cpp")):
                yield os.path.normpath(os.path.join(rel_dir, name)).replace(os.sep, "/")


def resolve(root, including, bracket, path):
    """The included file relative to root, or None when it is not ours."""
    candidates = [path] if bracket == "<" else [os.path.join(os.path.dirname(including), path), path]
    for c in candidates:
        c = os.path.normpath(c).replace(os.sep, "/")
        if not c.startswith("../") and os.path.isfile(os.path.join(root, c)):
            return c
    if bracket == '"' and module_of(path) in ALLOWED:
        return os.path.normpath(path)
    return None


def has_guard(text, owner):
    macro = "ENTENTE_IN_" + owner.upper()
    return re.search(r"#\s*if\s+!\s*defined\s*\(\s*%s\s*\)" % macro, text) and "#error" in text


def check_links(root, problems):
    """Every target_link_libraries of an entente_* target in each folder's
    CMakeLists.txt files, against the module table."""
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames
                           if not d.startswith((".", "build")) and d not in SKIP_DIRS]
            continue
        mod = rel_dir.split("/", 1)[0]
        if "CMakeLists.txt" not in filenames or mod not in ALLOWED:
            continue
        rel = rel_dir + "/CMakeLists.txt"
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            text = re.sub(r"#[^\n]*", "", f.read())
        for call in re.finditer(r"target_link_libraries\s*\(([^)]*)\)", text):
            number = text.count("\n", 0, call.start()) + 1
            for name in re.findall(r"\bentente_\w+", call.group(1))[1:]:
                used = TARGETS.get(name)
                if used is None:
                    problems.append(f"{rel}:{number}: {name} is not in the target table of "
                                    "scripts/check-includes.py")
                elif used != mod and used not in ALLOWED[mod]:
                    allowed = ", ".join(sorted(ALLOWED[mod])) or "nothing of ours"
                    problems.append(f"{rel}:{number}: module {mod} may not link {name} "
                                    f"(module {used}; allowed: {allowed})")


def check(root):
    problems = []
    for rel in sorted(sources(root)):
        mod = module_of(rel)
        if mod is None:
            continue
        if mod not in ALLOWED:
            problems.append(f"{rel}:1: folder {mod}/ is not in the module table of "
                            "scripts/check-includes.py (nor, then, of docs/architecture.md)")
            continue
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            text = f.read()
        owner = private_owner(rel)
        if owner and rel.endswith(".h") and not has_guard(text, owner):
            problems.append(f"{rel}:1: private header without its guard: "
                            f"#if !defined(ENTENTE_IN_{owner.upper()}) / #error / #endif")
        for number, line in enumerate(text.splitlines(), 1):
            m = INCLUDE_RE.match(line)
            if not m:
                continue
            target = resolve(root, rel, m.group(1), m.group(2))
            if target is None:
                continue
            used = module_of(target)
            if used is None or used == mod:
                pass
            elif used not in ALLOWED[mod]:
                allowed = ", ".join(sorted(ALLOWED[mod])) or "nothing of ours"
                problems.append(f"{rel}:{number}: module {mod} may not include module {used} "
                                f"({target}; allowed: {allowed})")
                continue
            private = private_owner(target)
            if private and not may_see_private(rel, private) and (rel, target) not in EXEMPT:
                problems.append(f"{rel}:{number}: {target} is private to {private}/ "
                                f"(only {private}/ and tests/{private}/ may include it)")
    check_links(root, problems)
    return problems


def main(argv):
    if len(argv) > 2 or (len(argv) == 2 and argv[1].startswith("-")):
        print("usage: scripts/check-includes.py [ROOT]", file=sys.stderr)
        return 2
    root = argv[1] if len(argv) == 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    problems = check(os.path.abspath(root))
    for p in problems:
        print(p)
    if problems:
        print(f"check-includes: {len(problems)} problem(s); the allowed directions are in "
              "docs/architecture.md, \"Modules and dependencies\"", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
