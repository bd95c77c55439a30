package relay_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestTiers keeps the tiers of internal/ (docs/architecture.md, "The
// packages") apart, by reading the imports of the files:
//
//   - the mechanisms (every package under internal/ but tools/, testkit/ and
//     tests/) sit below the root: their code imports neither the root (nor a
//     public package above it) nor a tool nor test support, and their tests
//     import neither a tool nor a package of tests (an external test may
//     import the root and test support);
//   - test support (internal/testkit/) imports no tool and no package of tests;
//   - the root's code imports nothing of internal/tools, internal/testkit or
//     internal/tests.
func TestTiers(t *testing.T) {
	const (
		root    = "github.com/xadm/relay"
		tools   = root + "/internal/tools/"
		testkit = root + "/internal/testkit/"
		tests   = root + "/internal/tests/"
	)
	under := func(path string, prefixes ...string) bool {
		for _, p := range prefixes {
			if strings.HasPrefix(path, p) {
				return true
			}
		}
		return false
	}
	// check reports the imports of the .go files of dir (and below it, when
	// deep) that bad refuses.
	check := func(dir string, deep bool, bad func(imp string, test bool) bool) int {
		files := 0
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if path != dir && (!deep || d.Name() == "testdata") {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") {
				return nil
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
			if err != nil {
				return err
			}
			files++
			test := strings.HasSuffix(path, "_test.go")
			for _, spec := range f.Imports {
				imp, err := strconv.Unquote(spec.Path.Value)
				if err != nil {
					return err
				}
				if bad(imp, test) {
					t.Errorf("%s imports %s", path, imp)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return files
	}

	n := check(".", false, func(imp string, test bool) bool {
		return !test && under(imp, tools, testkit, tests)
	})
	entries, err := os.ReadDir("internal")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		dir := filepath.Join("internal", e.Name())
		switch e.Name() {
		case "tools", "tests":
			// Above the root: they may import anything.
		case "testkit":
			n += check(dir, true, func(imp string, _ bool) bool {
				return under(imp, tools, tests)
			})
		default:
			n += check(dir, true, func(imp string, test bool) bool {
				if test {
					return under(imp, tools, tests)
				}
				// Nor a public package above the root (inbox, relaytest, ...).
				return imp == root || under(imp, tools, testkit, tests) ||
					under(imp, root+"/") && !under(imp, root+"/internal/")
			})
		}
	}
	if n < 50 {
		t.Fatalf("read the imports of %d files only: is the test run from the module's root?", n)
	}
}
