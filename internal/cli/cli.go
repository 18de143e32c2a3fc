// Package cli is how every kvroute command speaks: one --help layout and one way to
// report a bad command line.
//
// --help prints, to standard output:
//
//	<name>: <intro, one paragraph>
//
//	Usage:
//	  <name> <synopsis>
//	  ...
//
//	<details, optional: API, syntax, examples>
//
//	Flags:
//	  --flag type
//	    	description (default value)
//
// Flags are shown GNU-style (--name; -name parses too). The flag package appends
// "(default ...)" itself, so a description never states a default that the flag's own
// value can show. A bad command line is one line on standard error, the problem and a
// pointer to --help, and exit status 2; any other failure is one line and status 1.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// Help is what --help says before the flags.
type Help struct {
	// Intro is one paragraph: what the command does. Written after "<name>: ".
	Intro string
	// Usage holds the synopsis lines, each without the command's name ("[flags]").
	Usage []string
	// Details, optional, go between the synopsis and the flags.
	Details string
}

// NewFlagSet returns an empty flag set for the command name whose usage prints h and
// the flags to out.
func NewFlagSet(name string, h Help, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() { writeHelp(fs.Output(), fs, h) }
	return fs
}

func writeHelp(w io.Writer, fs *flag.FlagSet, h Help) {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s\n\nUsage:\n", fs.Name(), strings.TrimSpace(h.Intro))
	for _, u := range h.Usage {
		fmt.Fprintf(&b, "  %s %s\n", fs.Name(), u)
	}
	if d := strings.Trim(h.Details, "\n"); d != "" {
		fmt.Fprintf(&b, "\n%s\n", d)
	}
	b.WriteString("\nFlags:\n")
	var flags strings.Builder
	fs.SetOutput(&flags)
	fs.PrintDefaults()
	fs.SetOutput(w)
	// PrintDefaults starts every flag's line with "  -" and its description with a tab.
	b.WriteString(strings.ReplaceAll("\n"+flags.String(), "\n  -", "\n  --")[1:])
	io.WriteString(w, b.String())
}

// UsageError is a command line the command cannot run: exit status 2.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Usagef returns a *UsageError: for flag values that parse but do not make sense.
func Usagef(format string, a ...any) error {
	return &UsageError{Err: fmt.Errorf(format, a...)}
}

// Parse parses args into fs. --help (or -h) prints the help to fs's output and returns
// flag.ErrHelp; an unknown flag, a bad value or a positional argument returns a
// *UsageError, and nothing is printed.
func Parse(fs *flag.FlagSet, args []string) error {
	out, usage := fs.Output(), fs.Usage
	help := false
	fs.SetOutput(io.Discard)
	fs.Usage = func() { help = true }
	err := fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = usage
	switch {
	case help && errors.Is(err, flag.ErrHelp):
		usage()
		return flag.ErrHelp
	case err != nil:
		return &UsageError{Err: err}
	case fs.NArg() > 0:
		return Usagef("unexpected arguments %q", fs.Args())
	}
	return nil
}

// Exit reports err from the command name on stderr as one line and returns the exit
// status: 0 for nil and flag.ErrHelp, 2 for a *UsageError (with a pointer to --help), 1
// otherwise.
func Exit(name string, err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	msg := strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "; ")
	var u *UsageError
	if errors.As(err, &u) {
		fmt.Fprintf(stderr, "%s: %s (%s --help lists the flags)\n", name, msg, name)
		return 2
	}
	fmt.Fprintf(stderr, "%s: %s\n", name, msg)
	return 1
}
