package workload

import (
	"fmt"
	"strings"
)

// Part is one sender of a mixed workload: a tenant, the class its requests carry, and
// its share of the requests.
type Part struct {
	Tenant, Class string
	Share         float64
}

// DefaultParts are the mixed workload of docs/overload.md: interactive chat (critical),
// a team's regular traffic (standard), a noisy tenant that sends as much as the others
// together (standard), and a batch job (sheddable).
func DefaultParts() []Part {
	return []Part{
		{Tenant: "interactive", Class: "critical", Share: 0.15},
		{Tenant: "team", Class: "standard", Share: 0.25},
		{Tenant: "noisy", Class: "standard", Share: 0.40},
		{Tenant: "batch", Class: "sheddable", Share: 0.20},
	}
}

// Mixed gives each request of another workload a tenant and a class, drawn from the
// parts' shares by the request's index: the arrivals and prompts are the base's.
type Mixed struct {
	Workload
	parts []Part
	part  []uint8 // request i's part
}

// NewMixed splits w's requests between parts (at most 255, shares summing to 1 or less:
// the rest goes to the last part).
func NewMixed(w Workload, parts []Part, seed uint64) (*Mixed, error) {
	if len(parts) == 0 || len(parts) > 255 {
		return nil, fmt.Errorf("mixed workload: %d parts, want 1 to 255", len(parts))
	}
	m := &Mixed{Workload: w, parts: parts, part: make([]uint8, w.Len())}
	for i := range m.part {
		x := float64(Mix(seed^0x3137, uint64(i))>>11) / (1 << 53)
		k := 0
		for ; k < len(parts)-1 && x >= parts[k].Share; k++ {
			x -= parts[k].Share
		}
		m.part[i] = uint8(k)
	}
	return m, nil
}

// Name implements Workload.
func (m *Mixed) Name() string { return "mixed " + m.Workload.Name() }

// Describe implements Workload.
func (m *Mixed) Describe() string {
	var b strings.Builder
	b.WriteString(m.Workload.Describe())
	b.WriteString("; senders")
	for _, p := range m.parts {
		fmt.Fprintf(&b, " %s/%s %.0f%%", p.Tenant, p.Class, 100*p.Share)
	}
	return b.String()
}

// Part is request i's sender.
func (m *Mixed) Part(i int) Part { return m.parts[m.part[i]] }

// NewSource implements Workload.
func (m *Mixed) NewSource() Source { return &mixedSource{m: m, base: m.Workload.NewSource()} }

type mixedSource struct {
	m    *Mixed
	base Source
}

func (s *mixedSource) Request(i int) *Request {
	r := s.base.Request(i)
	p := s.m.Part(i)
	r.Tenant, r.Class = p.Tenant, p.Class
	return r
}
