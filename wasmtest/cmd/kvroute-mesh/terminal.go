package main

import (
	"io"
	"os"

	"golang.org/x/term"
)

// isTerminal reports whether w is a terminal that takes ANSI cursor movement: a file
// that is a terminal, with TERM neither empty nor "dumb".
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return false
	}
	t := os.Getenv("TERM")
	return t != "" && t != "dumb"
}
