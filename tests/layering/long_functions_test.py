#!/usr/bin/env python3
"""scripts/long-functions.py on a file written for the test: the functions
over the bound are named with their first line and length, and braces in
comments, strings, raw strings and preprocessor lines do not count."""

import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                      "long-functions.py")


def body(n):
    return "".join(f"  x += {i};\n" for i in range(n))


SOURCE = (
    '#include "a.h"\n'                                   # 1
    "#define OPEN {\n"                                   # 2
    "namespace entente {\n"                              # 3
    "namespace {\n"                                      # 4
    "const char* kText = \"}}}\";  // {{{\n"             # 5
    "int table[] = {1, 2, 3};\n"                         # 6
    "}  // namespace\n"                                  # 7
    "/* { */\n"                                          # 8
    "int Widget::long_one(int x) const {\n"              # 9..19
    "  auto f = [&](int y) { return R\"({)\" + y; };\n"  # 10
    + body(8) +                                          # 11..18
    "}\n"                                                # 19
    "class Widget {\n"                                   # 20
    " public:\n"                                         # 21
    "  void inline_one() {\n"                            # 22..35
    + body(12) +
    "  }\n"                                              # 35
    "};\n"
    "void short_one() {\n"
    + body(3) +
    "}\n"
    "TEST(Suite, Name) {\n"
    + body(20) +
    "}\n"
    "}  // namespace entente\n"
)


class LongFunctions(unittest.TestCase):
    def run_script(self, *args):
        with tempfile.TemporaryDirectory() as root:
            path = os.path.join(root, "x.cpp")
            with open(path, "w") as f:
                f.write(SOURCE)
            p = subprocess.run([sys.executable, SCRIPT, *args, path], capture_output=True, text=True)
            return p.returncode, [line.split(": ", 1)[1] if ": " in line else line
                                  for line in p.stdout.splitlines()]

    def test_functions_over_the_bound_longest_first(self):
        rc, lines = self.run_script("--max", "10")
        self.assertEqual(rc, 1)
        self.assertEqual(lines, ["TEST(Suite, Name) is 22 lines", "inline_one is 14 lines",
                                 "Widget::long_one is 11 lines"])

    def test_nothing_over_the_bound_passes(self):
        self.assertEqual(self.run_script("--max", "22"), (0, []))


if __name__ == "__main__":
    unittest.main(verbosity=2)
