// Command modproxy writes a module proxy for relay's modules, laid out as Go's
// module proxy protocol describes (<module>/@v/list, <version>.info, .mod and
// .zip), from the repository's tree as it would be tagged at a version: the
// files git tracks, with their contents in the work tree. Point GOPROXY at it
// with a file:// URL.
//
//	go run . -repo ../.. -version v0.1.0 -out /tmp/proxy
//
// It is the release check's tool (.ci/release-check, scripts/tidy) and lives in
// a module of its own so that the core module does not depend on x/mod. It
// prints one line per module written: its path and its directory in the tree.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	modzip "golang.org/x/mod/zip"
)

func main() {
	repo := flag.String("repo", ".", "the repository's root (a git work tree)")
	version := flag.String("version", "", "the version to write every module at, vX.Y.Z")
	out := flag.String("out", "", "the proxy directory to write (created; must be outside the repository)")
	flag.Parse()
	if err := run(*repo, *version, *out, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "modproxy:", err)
		os.Exit(1)
	}
}

// trackedFile is one file git tracks, read from the work tree.
type trackedFile struct {
	rel  string // slash path relative to the module's directory
	abs  string
	info fs.FileInfo
}

func (f trackedFile) Path() string                 { return f.rel }
func (f trackedFile) Lstat() (fs.FileInfo, error)  { return f.info, nil }
func (f trackedFile) Open() (io.ReadCloser, error) { return os.Open(f.abs) }

func run(repo, version, out string, w io.Writer) error {
	if !semver.IsValid(version) || semver.Canonical(version) != version {
		return fmt.Errorf("-version %q: want a canonical semantic version such as v0.1.0", version)
	}
	if out == "" {
		return errors.New("-out: the proxy directory is required")
	}
	root, err := filepath.Abs(repo)
	if err != nil {
		return err
	}
	absOut, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	if rel, err := filepath.Rel(root, absOut); err == nil && !strings.HasPrefix(rel, "..") {
		return fmt.Errorf("-out %q: the proxy must be written outside the repository %q", out, root)
	}
	files, err := gitFiles(root)
	if err != nil {
		return err
	}
	mods := moduleDirs(files)
	if len(mods) == 0 {
		return fmt.Errorf("no go.mod tracked under %s", root)
	}
	for _, dir := range mods {
		p, err := writeModule(root, dir, files, version, absOut)
		if err != nil {
			return fmt.Errorf("module in %q: %w", dir, err)
		}
		fmt.Fprintf(w, "%s\t%s\n", p, dir)
	}
	return nil
}

// gitFiles lists the files git tracks under root that exist in the work tree
// (a file deleted but not yet committed would not be in the tag either).
func gitFiles(root string) ([]string, error) {
	cmd := exec.Command("git", "-C", root, "ls-files", "-z")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files in %s: %w: %s", root, err, stderr.String())
	}
	var files []string
	for _, f := range strings.Split(string(b), "\x00") {
		if f == "" {
			continue
		}
		if _, err := os.Lstat(filepath.Join(root, filepath.FromSlash(f))); err == nil {
			files = append(files, f)
		}
	}
	return files, nil
}

// moduleDirs returns the directories (slash paths, "." for the root) of the
// tracked go.mod files that are published: every module except those under an
// internal directory, which no one outside the repository can use.
func moduleDirs(files []string) []string {
	var dirs []string
	for _, f := range files {
		if path.Base(f) != "go.mod" {
			continue
		}
		dir := path.Dir(f)
		if internal(dir) {
			continue
		}
		dirs = append(dirs, dir)
	}
	sort.Strings(dirs)
	return dirs
}

func internal(dir string) bool {
	for _, e := range strings.Split(dir, "/") {
		if e == "internal" {
			return true
		}
	}
	return false
}

// writeModule writes the module in dir at version into the proxy out and
// returns its path.
func writeModule(root, dir string, files []string, version, out string) (string, error) {
	gomod, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(dir), "go.mod"))
	if err != nil {
		return "", err
	}
	mf, err := modfile.Parse("go.mod", gomod, nil)
	if err != nil {
		return "", err
	}
	if mf.Module == nil {
		return "", errors.New("go.mod has no module line")
	}
	if len(mf.Replace) > 0 {
		return "", fmt.Errorf("go.mod has a replace (%s): adopters would not see it, so the module would not resolve", mf.Replace[0].Old.Path)
	}
	mpath := mf.Module.Mod.Path
	m := module.Version{Path: mpath, Version: version}
	if err := module.Check(mpath, version); err != nil {
		return "", err
	}
	epath, err := module.EscapePath(mpath)
	if err != nil {
		return "", err
	}
	vdir := filepath.Join(out, filepath.FromSlash(epath), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return "", err
	}
	var zfiles []modzip.File
	prefix := dir + "/"
	for _, f := range files {
		rel := f
		if dir != "." {
			if !strings.HasPrefix(f, prefix) {
				continue
			}
			rel = strings.TrimPrefix(f, prefix)
		}
		abs := filepath.Join(root, filepath.FromSlash(f))
		info, err := os.Lstat(abs)
		if err != nil {
			return "", err
		}
		zfiles = append(zfiles, trackedFile{rel: rel, abs: abs, info: info})
	}
	var zbuf bytes.Buffer
	if err := modzip.Create(&zbuf, m, zfiles); err != nil {
		return "", err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return "", err
	}
	for name, data := range map[string][]byte{
		version + ".mod":  gomod,
		version + ".zip":  zbuf.Bytes(),
		version + ".info": info,
		"list":            []byte(version + "\n"),
	} {
		if err := os.WriteFile(filepath.Join(vdir, name), data, 0o644); err != nil {
			return "", err
		}
	}
	return mpath, nil
}
