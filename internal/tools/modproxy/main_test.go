package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

// A repository of two modules, one nested in the other: each gets its list,
// .info, .mod and .zip; the parent's zip leaves out the nested module and
// untracked files; a go.mod with a replace is refused.
func TestProxyOfTwoModules(t *testing.T) {
	repo := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		p := filepath.Join(repo, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", repo}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	write("go.mod", "module example.com/r\n\ngo 1.25.0\n")
	write("r.go", "package r\n")
	write("sub/go.mod", "module example.com/r/sub\n\ngo 1.25.0\n\nrequire example.com/r v0.3.0\n")
	write("sub/sub.go", "package sub\n")
	write("internal/tool/go.mod", "module example.com/r/internal/tool\n\ngo 1.25.0\n")
	git("init", "-q")
	git("add", ".")
	write("untracked.bin", "not in the tag")

	out := t.TempDir()
	var log strings.Builder
	if err := run(repo, "v0.3.0", out, &log); err != nil {
		t.Fatal(err)
	}
	if got, want := log.String(), "example.com/r\t.\nexample.com/r/sub\tsub\n"; got != want {
		t.Errorf("modules written:\n%s\nwant:\n%s", got, want)
	}
	for _, f := range []string{"list", "v0.3.0.info", "v0.3.0.mod", "v0.3.0.zip"} {
		for _, m := range []string{"example.com/r", "example.com/r/sub"} {
			if _, err := os.Stat(filepath.Join(out, m, "@v", f)); err != nil {
				t.Error(err)
			}
		}
	}
	cf, err := modzip.CheckZip(module.Version{Path: "example.com/r", Version: "v0.3.0"}, filepath.Join(out, "example.com/r/@v/v0.3.0.zip"))
	if err != nil {
		t.Fatal(err)
	}
	if len(cf.Valid) != 2 { // go.mod and r.go: not sub/, not untracked.bin
		t.Errorf("the core's zip holds %v, want go.mod and r.go", cf.Valid)
	}

	write("sub/go.mod", "module example.com/r/sub\n\ngo 1.25.0\n\nreplace example.com/r => ../\n")
	err = run(repo, "v0.3.0", t.TempDir(), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "replace") {
		t.Errorf("a go.mod with a replace: got %v, want an error naming the replace", err)
	}
	if err := run(repo, "v0.3", t.TempDir(), io.Discard); err == nil {
		t.Error("a non-canonical version was accepted")
	}
	if err := run(repo, "v0.3.0", filepath.Join(repo, "proxy"), io.Discard); err == nil {
		t.Error("a proxy inside the repository was accepted")
	}
}
