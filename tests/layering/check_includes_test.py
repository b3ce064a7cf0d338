#!/usr/bin/env python3
"""scripts/check-includes.py on small trees written for each case: it must
name every wrong arrow and every foreign private include, and pass what the
module table allows (docs/architecture.md, "Modules and dependencies")."""

import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                      "check-includes.py")

GUARD = '#pragma once\n#if !defined(ENTENTE_IN_{m})\n#error "private"\n#endif\n'

# A tree that follows the table: the base every case starts from.
GOOD = {
    "base/result.h": "#pragma once\n#include <string>\n",
    "engine/types.h": '#pragma once\n#include "base/result.h"\n#include "rapidjson/document.h"\n',
    "engine/detail/options.h": GUARD.format(m="ENGINE"),
    "engine/boxes/boxes.h": GUARD.format(m="ENGINE"),
    "engine/boxes/filter.cpp": '#include "engine/boxes/boxes.h"\n#include "engine/detail/options.h"\n',
    "net/address.cpp": "#include <net/if.h>\n#include <boost/asio.hpp>\n",
    "http/server.h": '#pragma once\n#include "base/result.h"\n',
    "http/detail/tls.h": GUARD.format(m="HTTP"),
    "http/server.cpp": '#include "http/server.h"\n#include "detail/tls.h"\n#include "net/address.h"\n',
    "net/address.h": "#pragma once\n",
    "broker/node.cpp": '#include "engine/types.h"\n#include "http/server.h"\n#include "entente_version.h"\n',
    "tests/engine/options_test.cpp": '#include "engine/detail/options.h"\n#include "engine/boxes/boxes.h"\n',
    "tests/integration/api_test.cpp": '#include "broker/node.h"\n#include "http/server.h"\n',
    "broker/node.h": "#pragma once\n",
    "bench/main.cpp": '#include "engine/types.h"\n#include "http/server.h"\n',
    "build-asan/generated/x.cpp": '#include "engine/detail/options.h"\n',
    "docs/example.cpp": '#include "broker/node.h"\n',
    "engine/CMakeLists.txt": "# links entente_broker? never\n"
                             "target_link_libraries(entente_engine PUBLIC entente_base\n  Threads::Threads)\n",
    "broker/CMakeLists.txt": "target_link_libraries(entente_broker PUBLIC entente_http entente_engine)\n"
                             "target_link_libraries(entente PRIVATE entente_broker entente_version)\n",
    "tests/CMakeLists.txt": "target_link_libraries(${name} PRIVATE ${libs} entente_nexmark GTest::gtest)\n",
}


def run(extra):
    with tempfile.TemporaryDirectory() as root:
        for rel, text in {**GOOD, **extra}.items():
            if text is None:
                continue
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        p = subprocess.run([sys.executable, SCRIPT, root], capture_output=True, text=True)
        return p.returncode, p.stdout.splitlines()


class CheckIncludes(unittest.TestCase):
    def assert_one_problem(self, extra, expected):
        rc, lines = run(extra)
        self.assertEqual(rc, 1, lines)
        self.assertEqual(lines, [expected])

    def test_a_tree_that_follows_the_table_passes(self):
        self.assertEqual(run({}), (0, []))

    def test_an_arrow_against_the_direction_fails(self):
        self.assert_one_problem(
            {"engine/expr.cpp": '#include <vector>\n#include "broker/node.h"\n'},
            "engine/expr.cpp:2: module engine may not include module broker "
            "(broker/node.h; allowed: base)")

    def test_the_bottom_includes_nothing_of_ours(self):
        self.assert_one_problem(
            {"base/units.cpp": '#include "engine/types.h"\n'},
            "base/units.cpp:1: module base may not include module engine "
            "(engine/types.h; allowed: nothing of ours)")

    def test_http_may_not_know_the_broker(self):
        self.assert_one_problem(
            {"http/client.cpp": '#include "broker/node.h"\n'},
            "http/client.cpp:1: module http may not include module broker "
            "(broker/node.h; allowed: base, net)")

    def test_angle_brackets_to_our_files_count_too(self):
        self.assert_one_problem(
            {"net/detail/asio_src.cpp": "#include <engine/types.h>\n"},
            "net/detail/asio_src.cpp:1: module net may not include module engine "
            "(engine/types.h; allowed: base)")

    def test_a_missing_file_of_ours_is_still_checked(self):
        self.assert_one_problem(
            {"store/store.cpp": '#include "federation/gone.h"\n'},
            "store/store.cpp:1: module store may not include module federation "
            "(federation/gone.h; allowed: base)")

    def test_another_modules_detail_fails(self):
        self.assert_one_problem(
            {"broker/api.cpp": '#include "engine/detail/options.h"\n'},
            "broker/api.cpp:1: engine/detail/options.h is private to engine/ "
            "(only engine/ and tests/engine/ may include it)")

    def test_the_engines_boxes_are_private(self):
        self.assert_one_problem(
            {"bench/q.cpp": '#include "engine/boxes/boxes.h"\n'},
            "bench/q.cpp:1: engine/boxes/boxes.h is private to engine/ "
            "(only engine/ and tests/engine/ may include it)")

    def test_tests_see_only_their_own_modules_detail(self):
        rc, lines = run({
            "tests/broker/x_test.cpp": '#include "http/detail/tls.h"\n',
            "tests/integration/y_test.cpp": '#include "engine/detail/options.h"\n',
        })
        self.assertEqual(rc, 1)
        self.assertEqual(lines, [
            "tests/broker/x_test.cpp:1: http/detail/tls.h is private to http/ "
            "(only http/ and tests/http/ may include it)",
            "tests/integration/y_test.cpp:1: engine/detail/options.h is private to engine/ "
            "(only engine/ and tests/engine/ may include it)",
        ])

    def test_tests_may_not_be_included_from_a_library_or_bench(self):
        rc, lines = run({"tests/support/tmp.h": "#pragma once\n",
                         "bench/b.cpp": '#include "tests/support/tmp.h"\n'})
        self.assertEqual(rc, 1)
        self.assertEqual(len(lines), 1)
        self.assertTrue(lines[0].startswith("bench/b.cpp:1: module bench may not include module tests"),
                        lines)

    def test_a_private_header_needs_its_guard(self):
        self.assert_one_problem(
            {"certs/detail/ossl.h": "#pragma once\n#include <string>\n"},
            "certs/detail/ossl.h:1: private header without its guard: "
            "#if !defined(ENTENTE_IN_CERTS) / #error / #endif")

    def test_a_guard_naming_another_module_does_not_count(self):
        self.assert_one_problem(
            {"certs/detail/ossl.h": GUARD.format(m="BROKER")},
            "certs/detail/ossl.h:1: private header without its guard: "
            "#if !defined(ENTENTE_IN_CERTS) / #error / #endif")

    def test_an_unknown_folder_must_join_the_table_first(self):
        self.assert_one_problem(
            {"scheduler/plan.cpp": '#include "base/result.h"\n'},
            "scheduler/plan.cpp:1: folder scheduler/ is not in the module table of "
            "scripts/check-includes.py (nor, then, of docs/architecture.md)")

    def test_the_cluster_sits_on_http_and_under_the_broker(self):
        self.assert_one_problem(
            {"cluster/etcd.cpp": '#include "http/client.h"\n#include "broker/node.h"\n',
             "broker/cluster.cpp": '#include "cluster/etcd.h"\n'},
            "cluster/etcd.cpp:2: module cluster may not include module broker "
            "(broker/node.h; allowed: base, http, net)")

    def test_a_link_against_the_direction_fails(self):
        self.assert_one_problem(
            {"store/CMakeLists.txt": "add_library(entente_store STATIC x.cpp)\n\n"
                                     "target_link_libraries(entente_store PUBLIC entente_base\n"
                                     "  PRIVATE entente_engine rocksdb)\n"},
            "store/CMakeLists.txt:3: module store may not link entente_engine "
            "(module engine; allowed: base)")

    def test_a_link_to_an_unknown_target_must_join_the_table(self):
        self.assert_one_problem(
            {"http/CMakeLists.txt": "target_link_libraries(entente_http PUBLIC entente_scheduler)\n"},
            "http/CMakeLists.txt:1: entente_scheduler is not in the target table of "
            "scripts/check-includes.py")

if __name__ == "__main__":
    unittest.main(verbosity=2)
