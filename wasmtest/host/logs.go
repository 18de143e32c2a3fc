package host

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// LogLevel is a proxy-wasm log level.
type LogLevel uint32

const (
	LevelTrace LogLevel = iota
	LevelDebug
	LevelInfo
	LevelWarn
	LevelError
	LevelCritical
)

func (l LogLevel) String() string {
	switch l {
	case LevelTrace:
		return "trace"
	case LevelDebug:
		return "debug"
	case LevelInfo:
		return "info"
	case LevelWarn:
		return "warn"
	case LevelError:
		return "error"
	case LevelCritical:
		return "critical"
	}
	return fmt.Sprintf("level(%d)", uint32(l))
}

// slogLevel maps proxy-wasm levels onto slog's (trace and critical sit outside slog's four).
func (l LogLevel) slogLevel() slog.Level {
	switch l {
	case LevelTrace:
		return slog.LevelDebug - 4
	case LevelDebug:
		return slog.LevelDebug
	case LevelInfo:
		return slog.LevelInfo
	case LevelWarn:
		return slog.LevelWarn
	case LevelError:
		return slog.LevelError
	}
	return slog.LevelError + 4
}

// LogEntry is one log line: from proxy_log, from the guest's stdout/stderr, or from the
// host itself (a VM failure). VM is -1 for host lines not tied to a VM.
type LogEntry struct {
	Time    time.Time // host clock
	VM      int
	Level   LogLevel
	Message string
}

func (e LogEntry) String() string {
	return fmt.Sprintf("vm%d %s %s", e.VM, e.Level, e.Message)
}

// keepLogs bounds the in-memory log.
const keepLogs = 10_000

type logBook struct {
	logger *slog.Logger
	mu     sync.Mutex
	ring   []LogEntry
	next   int
	full   bool
}

func newLogBook(l *slog.Logger) *logBook { return &logBook{logger: l, ring: make([]LogEntry, 0, 256)} }

func (b *logBook) add(t time.Time, vm int, level LogLevel, msg string) {
	b.logger.Log(context.Background(), level.slogLevel(), msg, "vm", vm, "level", level.String())
	b.mu.Lock()
	defer b.mu.Unlock()
	e := LogEntry{Time: t, VM: vm, Level: level, Message: msg}
	if len(b.ring) < keepLogs {
		b.ring = append(b.ring, e)
		return
	}
	b.ring[b.next] = e
	b.next = (b.next + 1) % keepLogs
	b.full = true
}

func (b *logBook) entries() []LogEntry {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.full {
		return append([]LogEntry(nil), b.ring...)
	}
	return append(append([]LogEntry(nil), b.ring[b.next:]...), b.ring[:b.next]...)
}

// lineWriter keeps the end of what a guest wrote to stderr, line by line, so a VM that
// fails can say why (fd_write itself logs every call, wasi.go).
type lineWriter struct {
	mu       sync.Mutex
	buf      []byte
	panicked string // the last "panic:" or "fatal error:" line (Go's runtime writes it to stderr)
	last     string // the last line
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		line := string(w.buf[:i])
		w.buf = w.buf[i+1:]
		if strings.TrimSpace(line) != "" {
			w.last = line
			if strings.HasPrefix(line, "panic: ") || strings.HasPrefix(line, "fatal error: ") {
				w.panicked = line
			}
		}
	}
	return len(p), nil
}

// tail summarises what the guest last wrote: its panic message if it panicked.
func (w *lineWriter) tail() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.panicked != "" {
		return w.panicked
	}
	return w.last
}

// TextLogger returns a logger that writes plugin log lines at or above min to w, as text.
func TextLogger(w io.Writer, min LogLevel) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: min.slogLevel()}))
}
