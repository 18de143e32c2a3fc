package openai

import (
	"fmt"
	"net/http"
	"strconv"
	"unicode/utf8"
)

// Error is an API error as vLLM renders it.
type Error struct {
	Status  int
	Type    string
	Message string
	Param   string // "" = null
}

func (e *Error) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Type, e.Message) }

// Envelope is the shape of an error body, by vLLM release (package version).
type Envelope uint8

const (
	// Nested: {"error": {"message", "type", "param", "code"}}, vLLM >= 0.10.1 (PR
	// #22099): ErrorResponse(error=ErrorInfo(...)) in
	// vllm/entrypoints/openai/engine/protocol.py @040a2cc2, filled by
	// create_error_response in vllm/entrypoints/openai/engine/serving.py @619e4b31.
	Nested Envelope = iota
	// Flat: {"object": "error", "message", "type", "param", "code"}, vLLM <= 0.10.0
	// (ErrorResponse and create_error_response in
	// vllm/entrypoints/openai/serving_engine.py @7ded96b3).
	Flat
)

// Body returns the JSON body in the nested envelope (the newest releases).
func (e *Error) Body() []byte { return e.JSON(Nested) }

// fields writes the error object's members in pydantic's field order.
func (e *Error) fields(b []byte, env Envelope, sep, colon string, ascii bool) []byte {
	kv := func(b []byte, k string) []byte {
		b = pyString(b, k, ascii)
		return append(b, colon...)
	}
	b = append(b, '{')
	if env == Flat {
		b = kv(b, "object")
		b = pyString(b, "error", ascii)
		b = append(b, sep...)
	}
	b = kv(b, "message")
	b = pyString(b, e.Message, ascii)
	b = append(b, sep...)
	b = kv(b, "type")
	b = pyString(b, e.Type, ascii)
	b = append(b, sep...)
	b = kv(b, "param")
	if e.Param == "" {
		b = append(b, "null"...)
	} else {
		b = pyString(b, e.Param, ascii)
	}
	b = append(b, sep...)
	b = kv(b, "code")
	b = strconv.AppendInt(b, int64(e.Status), 10)
	return append(b, '}')
}

// JSON is the body of an error response as vLLM's API server sends it:
// JSONResponse(err.model_dump()), which starlette renders compactly with
// ensure_ascii=False (starlette/responses.py JSONResponse.render @1f6b2305).
func (e *Error) JSON(env Envelope) []byte {
	if env == Flat {
		return e.fields(nil, env, ",", ":", false)
	}
	b := append([]byte(nil), `{"error":`...)
	b = e.fields(b, env, ",", ":", false)
	return append(b, '}')
}

// StreamJSON is the data of an error event in an SSE stream:
// create_streaming_error_response's json.dumps, with Python's default separators and
// ensure_ascii. Nested: json.dumps(create_error_response(...).model_dump()) (engine/
// serving.py @619e4b31); flat releases wrapped their flat object the same way:
// json.dumps({"error": create_error_response(...).model_dump()}) (serving_engine.py
// @7ded96b3).
func (e *Error) StreamJSON(env Envelope) []byte {
	b := append([]byte(nil), `{"error": `...)
	b = e.fields(b, env, ", ", ": ", true)
	return append(b, '}')
}

// Write sends the error as the HTTP response, nested envelope.
func (e *Error) Write(w http.ResponseWriter) { e.WriteAs(w, Nested) }

// WriteAs sends the error as the HTTP response in envelope env.
func (e *Error) WriteAs(w http.ResponseWriter, env Envelope) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	w.Write(e.JSON(env))
}

// WriteDetail answers as FastAPI's default HTTPException handler does for requests no
// route takes: {"detail": "Not Found"} (404) or {"detail": "Method Not Allowed"}
// (405). vLLM registers its own handler for fastapi.HTTPException only
// (vllm/entrypoints/openai/api_server.py build_app @048027fb); starlette's router raises
// starlette.exceptions.HTTPException, which that handler does not match.
func WriteDetail(w http.ResponseWriter, status int) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b := append([]byte(nil), `{"detail":`...)
	b = pyString(b, http.StatusText(status), false)
	w.Write(append(b, '}'))
}

// pyString appends s as Python's json module writes a string: short escapes for
// quote, backslash, \n, \r, \t, \b, \f, \u00XX for other control characters and, with
// ascii (ensure_ascii=True), \uXXXX (surrogate pairs above U+FFFF) for non-ASCII.
func pyString(b []byte, s string, ascii bool) []byte {
	const hex = "0123456789abcdef"
	u4 := func(b []byte, r rune) []byte {
		return append(b, '\\', 'u', hex[r>>12&15], hex[r>>8&15], hex[r>>4&15], hex[r&15])
	}
	b = append(b, '"')
	for _, r := range s {
		switch {
		case r == '"':
			b = append(b, '\\', '"')
		case r == '\\':
			b = append(b, '\\', '\\')
		case r == '\n':
			b = append(b, '\\', 'n')
		case r == '\r':
			b = append(b, '\\', 'r')
		case r == '\t':
			b = append(b, '\\', 't')
		case r == '\b':
			b = append(b, '\\', 'b')
		case r == '\f':
			b = append(b, '\\', 'f')
		case r < 0x20:
			b = u4(b, r)
		case ascii && r > 0x7e && r <= 0xffff:
			b = u4(b, r)
		case ascii && r > 0xffff:
			r -= 0x10000
			b = u4(b, 0xd800+(r>>10))
			b = u4(b, 0xdc00+(r&0x3ff))
		default:
			b = utf8.AppendRune(b, r)
		}
	}
	return append(b, '"')
}

// BadRequest is a 400 BadRequestError.
func BadRequest(format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "BadRequestError", Message: fmt.Sprintf(format, args...)}
}

// NotFound is a 404 NotFoundError (vLLM: unknown model).
func NotFound(param, format string, args ...any) *Error {
	return &Error{Status: http.StatusNotFound, Type: "NotFoundError", Message: fmt.Sprintf(format, args...), Param: param}
}

// ServerError is a 500 InternalServerError or 503 ServiceUnavailableError.
func ServerError(status int, msg string) *Error {
	typ := "InternalServerError"
	if status == http.StatusServiceUnavailable {
		typ = "ServiceUnavailableError"
	}
	return &Error{Status: status, Type: typ, Message: msg}
}
