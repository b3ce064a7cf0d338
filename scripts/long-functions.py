#!/usr/bin/env python3
"""Lists the functions longer than a bound, longest first.

    scripts/long-functions.py [--max N] [PATH...]

PATH: files or folders (default: the repository's library and benchmark
folders, tests/ left out; build*/ and hidden folders are always skipped).
Prints `file:line: NAME is L lines` for each function (or TEST body) of a
.cpp file whose body, from the line of its name to its closing brace, is
longer than N lines (default 120), and exits 1 if there is any.

A brace scan, not a parser: comments, string and character literals
(raw strings included) are blanked first; then a `{` at namespace or class
scope whose declaration has a parameter list and no `=` before it opens a
function, and its matching `}` closes it. Lambdas and local classes count
toward the function they are in. Good enough for this tree's style; it is
a review aid, not a gate.
"""

import argparse
import os
import re
import sys

DEFAULT_DIRS = ["base", "engine", "store", "net", "http", "certs", "contracts", "federation",
                "broker", "bench"]
CONTAINER_RE = re.compile(r"^(?:template\s*<.*>\s*)?(?:namespace\b|class\b|struct\b|union\b|"
                          r'extern\s+"C"|extern\s*$)', re.S)
RAW_RE = re.compile(r'R"([^()\\\s]{0,16})\(')


def blank(text):
    """Comments and literals replaced by spaces, newlines kept."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and RAW_RE.match(text, i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            delim = ")" + RAW_RE.match(text, i).group(1) + '"'
            j = text.find(delim, i)
            j = n if j < 0 else j + len(delim)
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # digit separator 1'000
                out.append(c)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def function_name(header):
    header = re.sub(r"^\s*template\s*<[^{;]*?>\s*", "", header)
    m = re.search(r"(operator\s*(?:\(\)|[^\s(]+))\s*\(", header)
    if m is None:
        m = re.search(r"([A-Za-z_~][\w:~<>,]*)\s*\(", header)
    if m is None:
        return header.strip().split("\n")[0][:60]
    name = m.group(1)
    if name.isupper():  # a macro such as TEST(Suite, Name): keep its arguments
        close = header.find(")", m.end())
        return header[m.start():close + 1] if close > 0 else name
    return name


def functions(text):
    """(name, first line, last line) of each function in `text`."""
    src = blank(text)
    # Preprocessor lines (with their continuations) blanked too.
    src = re.sub(r"(?m)^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", lambda m: re.sub(r"[^\n]", " ", m.group(0)), src)
    found = []
    # Each scope: 'container' (namespace/class: functions may start inside),
    # 'other' (a function body, an initializer, an enum: skipped over).
    stack = []
    header_start = 0
    line = 1
    i = 0
    fn = None  # (name, line, depth) of the function being read
    for i, c in enumerate(src):
        if c == "\n":
            line += 1
        elif c in ";":
            if not stack or stack[-1] == "container":
                header_start = i + 1
        elif c == "{":
            in_container = not stack or stack[-1] == "container"
            if in_container:
                header = src[header_start:i]
                if CONTAINER_RE.match(header.strip()):
                    stack.append("container")
                elif "(" in header and "=" not in header.split("(", 1)[0]:
                    # An access specifier ends the previous declaration too.
                    lead = re.match(r"(?:\s*(?:public|protected|private)\s*:(?!:))?\s*", header).end()
                    name = function_name(header[lead:])
                    fn = (name, line - src.count("\n", header_start + lead, i), len(stack))
                    stack.append("function")
                else:
                    stack.append("other")
            else:
                stack.append("other")
            header_start = i + 1
        elif c == "}":
            if stack:
                kind = stack.pop()
                if kind == "function" and fn is not None and fn[2] == len(stack):
                    found.append((fn[0], fn[1], line))
                    fn = None
            if not stack or stack[-1] == "container":
                header_start = i + 1
    return found


def cpp_files(paths, root):
    for path in paths:
        if os.path.isfile(path):
            yield path
            continue
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "build")))
            for name in sorted(filenames):
                if name.endswith(".cpp"):
                    yield os.path.join(dirpath, name)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max", type=int, default=120, help="longest allowed (lines)")
    parser.add_argument("paths", nargs="*")
    args = parser.parse_args(argv[1:])
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    paths = args.paths or [os.path.join(root, d) for d in DEFAULT_DIRS if os.path.isdir(os.path.join(root, d))]
    long = []
    for path in cpp_files(paths, root):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for name, first, last in functions(text):
            length = last - first + 1
            if length > args.max:
                long.append((length, os.path.relpath(path, root), first, name))
    for length, path, first, name in sorted(long, key=lambda x: (-x[0], x[1], x[2])):
        print(f"{path}:{first}: {name} is {length} lines")
    return 1 if long else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
