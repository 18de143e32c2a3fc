package front

import (
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// smallAnswer is the largest answer written with one copy and one write; a larger body
// goes out after its head in a second write, uncopied (a full table can be megabytes).
const smallAnswer = 16 << 10

// response is the lean loop's http.ResponseWriter, one per connection, reset for each
// request. A handler that declares Content-Length has its body written as it comes; one
// that does not has it buffered and measured, so every answer is Content-Length framed
// (no chunking to write or for Envoy to read).
type response struct {
	c           *conn
	header      http.Header
	code        int
	wroteHeader bool
	declared    int64 // the handler's Content-Length, -1 if none
	written     int64
	sent        bool   // the head is on the wire
	out         []byte // the head, then a small body, or a buffered one
	body        []byte // the buffered body of an answer without Content-Length
	broken      bool   // the connection cannot carry another request
}

func (w *response) reset() {
	clear(w.header)
	w.code, w.wroteHeader, w.declared, w.written, w.sent, w.broken = 0, false, -1, 0, false, false
	w.out, w.body = w.out[:0], w.body[:0]
}

func (w *response) Header() http.Header { return w.header }

// SetReadDeadline sets the connection's read deadline, for the rest of the request's
// body (http.ResponseController); the loop sets its own again before the next request.
func (w *response) SetReadDeadline(deadline time.Time) error {
	return w.c.nc.SetReadDeadline(deadline)
}

func (w *response) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code)) // as net/http
	}
	if w.wroteHeader || code < 200 {
		return // informational answers are not sent: no lean handler asks for one
	}
	w.wroteHeader, w.code = true, code
	if v := w.header.Get("Content-Length"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
			w.declared = n
		} else {
			w.header.Del("Content-Length") // as net/http: a bad value is dropped, the body measured
		}
	}
}

func (w *response) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(w.code) {
		return 0, http.ErrBodyNotAllowed
	}
	if w.declared < 0 {
		w.body = append(w.body, p...)
		return len(p), nil
	}
	if w.written+int64(len(p)) > w.declared {
		w.broken = true
		return 0, http.ErrContentLength
	}
	w.written += int64(len(p))
	var err error
	if w.sent {
		err = w.c.write(p, nil)
	} else {
		err = w.sendHead(p)
	}
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// sendHead writes the head with the body's first bytes: in one write (one copy) when
// they are small, else the body uncopied after it.
func (w *response) sendHead(body []byte) error {
	w.sent = true
	w.appendHead()
	if len(w.out)+len(body) <= smallAnswer {
		w.out = append(w.out, body...)
		body = nil
	}
	return w.c.write(w.out, body)
}

// finish completes the answer after the handler returns.
func (w *response) finish() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.declared >= 0 && w.written < w.declared && bodyAllowed(w.code) {
		w.broken = true // the body the head promised is short: the peer cannot frame the next answer
		if w.written > 0 {
			return
		}
	}
	if w.sent {
		return
	}
	if w.declared < 0 && bodyAllowed(w.code) {
		if w.header.Get("Content-Type") == "" && len(w.body) > 0 {
			w.header.Set("Content-Type", http.DetectContentType(w.body)) // as net/http
		}
		w.header.Set("Content-Length", strconv.Itoa(len(w.body)))
	}
	w.sendHead(w.body) // an error has marked the connection broken
}

// appendHead writes the status line and headers into w.out, net/http's way: a Date,
// header values with line breaks turned to spaces, invalid names left out.
func (w *response) appendHead() {
	b := append(w.out[:0], "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(w.code), 10)
	b = append(b, ' ')
	b = append(b, http.StatusText(w.code)...)
	b = append(b, "\r\n"...)
	for k, vs := range w.header {
		if !validName(k) {
			continue
		}
		for _, v := range vs {
			b = append(b, k...)
			b = append(b, ": "...)
			for i := range len(v) {
				c := v[i]
				if c == '\r' || c == '\n' {
					c = ' '
				}
				b = append(b, c)
			}
			b = append(b, "\r\n"...)
		}
	}
	if _, ok := w.header["Date"]; !ok {
		b = append(b, "Date: "...)
		b = append(b, httpDate()...)
		b = append(b, "\r\n"...)
	}
	if w.c.closeAfter {
		b = append(b, "Connection: close\r\n"...)
	}
	w.out = append(b, "\r\n"...)
}

func bodyAllowed(code int) bool {
	return code != http.StatusNoContent && code != http.StatusNotModified
}

func validName(k string) bool {
	if k == "" {
		return false
	}
	for i := range len(k) {
		if !isToken(k[i]) {
			return false
		}
	}
	return true
}

// date is the Date header's value for one second, made once that second.
type date struct {
	sec   int64
	value string
}

var dateNow atomic.Pointer[date]

func httpDate() string {
	now := time.Now()
	if d := dateNow.Load(); d != nil && d.sec == now.Unix() {
		return d.value
	}
	d := &date{sec: now.Unix(), value: now.UTC().Format(http.TimeFormat)}
	dateNow.Store(d)
	return d.value
}
