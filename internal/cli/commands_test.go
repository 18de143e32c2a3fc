package cli_test

import (
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestEveryCommandSpeaksOneWay builds every command of the module (every main package
// under a cmd/ directory) and holds its --help and its answer to a bad command line to
// the layout package cli documents.
func TestEveryCommandSpeaksOneWay(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command builds the commands: %v", err)
	}
	list, err := exec.Command(goTool, "list", "-f", `{{if eq .Name "main"}}{{.ImportPath}}{{end}}`, "github.com/kvroute/kvroute/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []string
	for _, p := range strings.Fields(string(list)) {
		if strings.Contains(p, "/cmd/") {
			pkgs = append(pkgs, p)
		}
	}
	if len(pkgs) < 6 {
		t.Fatalf("found %d commands, want at least 6: %q", len(pkgs), pkgs)
	}
	bin := t.TempDir()
	if out, err := exec.Command(goTool, append([]string{"build", "-o", bin + "/"}, pkgs...)...).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	helps := map[string]string{}
	for _, p := range pkgs {
		name := filepath.Base(p)
		path := filepath.Join(bin, name)
		t.Run(name, func(t *testing.T) {
			stdout, stderr, code := runCommand(t, path, "--help")
			if code != 0 || stderr != "" {
				t.Errorf("--help: exit %d, stderr %q; want 0 and nothing", code, stderr)
			}
			checkHelp(t, name, stdout)
			helps[name] = stdout
			if h, _, code := runCommand(t, path, "-h"); h != stdout || code != 0 {
				t.Errorf("-h: exit %d and not the same text as --help", code)
			}
			for _, bad := range [][]string{{"--no-such-flag"}, {"stray-argument"}} {
				stdout, stderr, code := runCommand(t, path, bad...)
				if code != 2 || stdout != "" || strings.Count(stderr, "\n") != 1 ||
					!strings.HasPrefix(stderr, name+": ") || !strings.Contains(stderr, name+" --help") {
					t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2, nothing on stdout and one line on stderr naming the command and --help",
						bad, code, stdout, stderr)
				}
			}
		})
	}
	// A default one command shows for another's setting is that setting's real default.
	bench, cp := flagDefault(helps["kvroute-bench"], "spec-ttl"), flagDefault(helps["kvroute-controlplane"], "spec-ttl")
	if bench == "" || bench != cp {
		t.Errorf("kvroute-bench --spec-ttl shows default %q, the control plane's is %q", bench, cp)
	}
}

func runCommand(t *testing.T, path string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var o, e bytes.Buffer
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

var (
	flagLine    = regexp.MustCompile(`^  --[a-z0-9][a-z0-9-]*( [a-z0-9]+)?$`)
	goDefault   = regexp.MustCompile(` \(default [^()]*\)$`)
	defaultWord = regexp.MustCompile(`(?i)\bdefault`)
)

// checkHelp holds one --help text to the layout: "<name>: " and a one-paragraph intro,
// "Usage:" and synopsis lines, optional details, then "Flags:" and only flags, each
// GNU-style with its description on the next line, no default stated twice.
func checkHelp(t *testing.T, name, help string) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(help, "\n"), "\n")
	if !strings.HasPrefix(lines[0], name+": ") {
		t.Fatalf("--help starts %q, want %q", lines[0], name+": ")
	}
	i := 0
	for i < len(lines) && lines[i] != "" {
		i++
	}
	if i+2 >= len(lines) || lines[i+1] != "Usage:" || !strings.HasPrefix(lines[i+2], "  "+name) {
		t.Fatalf("the intro is not one paragraph followed by \"Usage:\" and %q lines:\n%s", "  "+name, help)
	}
	flags := -1
	for j := i + 2; j < len(lines); j++ {
		if lines[j] == "Flags:" {
			flags = j
			break
		}
	}
	if flags < 0 || lines[flags-1] != "" {
		t.Fatalf("no \"Flags:\" section after a blank line:\n%s", help)
	}
	n := 0
	for j := flags + 1; j < len(lines); j++ {
		if !flagLine.MatchString(lines[j]) {
			t.Errorf("line %q: want a flag, \"  --name [type]\"", lines[j])
			continue
		}
		n++
		var desc []string
		for j+1 < len(lines) && strings.HasPrefix(lines[j+1], "    \t") {
			j++
			desc = append(desc, strings.TrimPrefix(lines[j], "    \t"))
		}
		d := strings.Join(desc, " ")
		if d == "" {
			t.Errorf("%s: no description", lines[j])
		}
		// The flag package appends "(default X)" when the default is not the zero value;
		// then the description must not state a default of its own.
		if loc := goDefault.FindStringIndex(d); loc != nil && defaultWord.MatchString(d[:loc[0]]) {
			t.Errorf("%s: the default is stated twice: %q", strings.TrimSpace(lines[j-len(desc)]), d)
		}
		if strings.Count(d, "(default") > 1 {
			t.Errorf("%s: doubled default: %q", strings.TrimSpace(lines[j-len(desc)]), d)
		}
	}
	if n == 0 {
		t.Errorf("no flags listed:\n%s", help)
	}
}

// flagDefault returns the default --help shows for flag, "" if none.
func flagDefault(help, flag string) string {
	m := regexp.MustCompile(`(?m)^  --` + regexp.QuoteMeta(flag) + `( \S+)?\n    \t.*\(default ([^()]*)\)$`).FindStringSubmatch(help)
	if m == nil {
		return ""
	}
	return m[2]
}
