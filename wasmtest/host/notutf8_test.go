package host_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/host"
	"github.com/kvroute/kvroute/wasmtest/wasmbuild"
)

// notUTF8Bodies are BenchmarkKvrouteBodyNotUTF8's two chat bodies of about 900 KB: one
// message of plain text, and one of 0xff bytes, which are not UTF-8 (a hostile client's).
func notUTF8Bodies() (plain, notUTF8 []byte) {
	body := func(content string) []byte {
		return []byte(`{"model":"llama","messages":[{"role":"user","content":"` + content + `"}]}`)
	}
	line := "You are the assistant of a parcel company; follow the policy. "
	return body(strings.Repeat(line, 900<<10/len(line))), body(strings.Repeat("\xff", 900<<10))
}

// chunked is a chat request with body in 16 KB chunks (HTTP/2's default DATA frame) and
// its content-length, so the filter holds all of it below max_body_bytes.
func chunked(body []byte) host.Request {
	var chunks [][]byte
	for c := range slices.Chunk(body, 16<<10) {
		chunks = append(chunks, c)
	}
	req := kvRequest(chunks...)
	req.Headers = append(req.Headers, [2]string{"content-length", strconv.Itoa(len(body))})
	return req
}

// BenchmarkKvrouteBodyNotUTF8: a 900 KB chat body of plain text and one of bytes that are
// not UTF-8, through the compiled filter on a two-VM host, alternating request by request
// (on a loaded machine both slow alike): plain-p50-µs and notutf8-p50-µs are the guest's
// CPU time per request (every callback, host.Config.CPUTime), notutf8/plain-p50 their
// ratio. With -baseline OLD.wasm, the same for that module ("base-"), in the same loop.
//
//	go test ./wasmtest/host -run '^$' -bench KvrouteBodyNotUTF8 -benchtime 40x [-args -baseline OLD.wasm]
func BenchmarkKvrouteBodyNotUTF8(b *testing.B) {
	path, err := wasmbuild.Filter()
	require.NoError(b, err)
	type side struct {
		name                 string
		h                    *host.Host
		plain, notUTF8       []int64 // guest µs per request
		decisions, parseErrs int64
	}
	metric := func(h *host.Host, name string) int64 {
		v, _ := h.Metric(name)
		return v.Value
	}
	load := func(name, path string) *side {
		h, _ := loadQuietModule(b, path, host.Config{VMs: 2, Rand: host.SeededRand(3), CPUTime: true})
		return &side{name: name, h: h}
	}
	sides := []*side{load("", path)}
	if *baselineWasm != "" {
		sides = append(sides, load("base-", *baselineWasm))
	}
	plainBody, notUTF8Body := notUTF8Bodies()
	plain, notUTF8 := chunked(plainBody), chunked(notUTF8Body)
	do := func(s *side, req host.Request) int64 {
		res, err := s.h.Do(context.Background(), req)
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Forwarded.Body) != len(plainBody) && len(res.Forwarded.Body) != len(notUTF8Body) {
			b.Fatalf("%sforwarded %d bytes", s.name, len(res.Forwarded.Body))
		}
		return res.FilterTime.Microseconds()
	}
	for range 4 { // the VMs' buffers grow to the bodies' size
		for _, s := range sides {
			do(s, plain)
			do(s, notUTF8)
		}
	}
	for _, s := range sides {
		s.decisions, s.parseErrs = metric(s.h, "kvroute_decisions_total"), metric(s.h, "kvroute_parse_errors_total")
	}
	i := 0
	for b.Loop() {
		for j := range sides {
			s := sides[(i+j)%len(sides)] // alternate which module goes first, and which body
			if i%2 == 0 {
				s.plain = append(s.plain, do(s, plain))
				s.notUTF8 = append(s.notUTF8, do(s, notUTF8))
			} else {
				s.notUTF8 = append(s.notUTF8, do(s, notUTF8))
				s.plain = append(s.plain, do(s, plain))
			}
		}
		i++
	}
	for _, s := range sides {
		if n := metric(s.h, "kvroute_decisions_total") - s.decisions; n != int64(2*i) {
			b.Fatalf("%s%d of %d requests routed by the rule", s.name, n, 2*i)
		}
		if n := metric(s.h, "kvroute_parse_errors_total") - s.parseErrs; n != 0 {
			b.Fatalf("%s%d parse errors", s.name, n)
		}
		slices.Sort(s.plain)
		slices.Sort(s.notUTF8)
		p50, q50 := s.plain[len(s.plain)/2], s.notUTF8[len(s.notUTF8)/2]
		b.ReportMetric(float64(p50), s.name+"plain-p50-µs")
		b.ReportMetric(float64(q50), s.name+"notutf8-p50-µs")
		b.ReportMetric(float64(q50)/float64(p50), s.name+"notutf8/plain-p50")
		b.ReportMetric(float64(s.plain[len(s.plain)-1]), s.name+"plain-max-µs")
		b.ReportMetric(float64(s.notUTF8[len(s.notUTF8)-1]), s.name+"notutf8-max-µs")
	}
}
