package filemaps

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// goFile is a file name as a map writes it: "table.go", "hostcall_wasm.go".
var goFile = regexp.MustCompile(`\b[a-z0-9_]+\.go\b`)

// TestFileMapsNameEveryFile: each package doc's file map names every non-test .go file
// in its directory (whatever its build constraints; a doc.go holding the map may leave
// itself out) and only files that exist.
func TestFileMapsNameEveryFile(t *testing.T) {
	root := moduleRoot(t)
	maps := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		files, err := goFiles(path)
		if err != nil {
			return err
		}
		for _, f := range files {
			named, ok, err := fileMap(filepath.Join(path, f))
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			maps++
			rel, _ := filepath.Rel(root, filepath.Join(path, f))
			for _, g := range files {
				if g == "doc.go" && g == f {
					continue // a doc.go holds the map and nothing else to map
				}
				if !slices.Contains(named, g) {
					t.Errorf("%s: the file map omits %s", rel, g)
				}
			}
			for _, n := range named {
				if _, err := os.Stat(filepath.Join(path, n)); err != nil {
					t.Errorf("%s: the file map names %s, which is not in the package's directory", rel, n)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if maps == 0 {
		t.Fatalf("no file maps found under %s: the walk or the map syntax is wrong", root)
	}
}

// TestFileMapParsing pins what counts as a map and where it ends.
func TestFileMapParsing(t *testing.T) {
	for _, tc := range []struct {
		name string
		src  string
		want []string
		ok   bool
	}{
		{"no map", "// Package p does things with a.go.\npackage p\n", nil, false},
		{"paragraph to the package clause", "// Package p.\n//\n// Files: a.go (this), b_c.go (that),\n// d.go.\npackage p\n", []string{"a.go", "b_c.go", "d.go"}, true},
		{"list to the blank line", "// Package p.\n//\n// Files:\n//   - a.go: x.\n//   - b.go: y; c.go: z.\n//\n// Not an API, see e.go.\npackage p\n", []string{"a.go", "b.go", "c.go"}, true},
		{"comment not above the clause", "package p\n\n// Files: a.go.\nvar x int\n", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "p.go")
			if err := os.WriteFile(p, []byte(tc.src), 0o644); err != nil {
				t.Fatal(err)
			}
			got, ok, err := fileMap(p)
			if err != nil {
				t.Fatal(err)
			}
			if ok != tc.ok || !slices.Equal(got, tc.want) {
				t.Errorf("fileMap = %q, %v; want %q, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// fileMap returns the .go files named by the file map in path's package doc, and
// whether it has one.
func fileMap(path string) ([]string, bool, error) {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.PackageClauseOnly|parser.ParseComments)
	if err != nil {
		return nil, false, err
	}
	if f.Doc == nil {
		return nil, false, nil
	}
	var named []string
	in := false
	for _, c := range f.Doc.List {
		line := strings.TrimSpace(strings.TrimPrefix(c.Text, "//"))
		switch {
		case !in && strings.HasPrefix(line, "Files:"):
			in = true
		case in && line == "":
			return named, true, nil
		case !in:
			continue
		}
		named = append(named, goFile.FindAllString(line, -1)...)
	}
	return named, in, nil
}

// goFiles lists dir's non-test .go files.
func goFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if n := e.Name(); !e.IsDir() && strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
			out = append(out, n)
		}
	}
	return out, nil
}

// moduleRoot is the directory holding the module's go.mod, above this package.
func moduleRoot(t *testing.T) string {
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}
