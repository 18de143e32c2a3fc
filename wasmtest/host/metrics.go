package host

import (
	"sort"
	"sync"
)

// MetricType is the kind of a plugin metric (proxy_define_metric).
type MetricType uint32

const (
	Counter   MetricType = 0
	Gauge     MetricType = 1
	Histogram MetricType = 2
)

func (t MetricType) String() string {
	switch t {
	case Counter:
		return "counter"
	case Gauge:
		return "gauge"
	case Histogram:
		return "histogram"
	}
	return "unknown"
}

// maxSamples bounds the histogram samples kept per metric; Count and Sum stay exact.
const maxSamples = 100_000

// MetricValue is a snapshot of one metric. Metrics are shared by name across the VMs of a
// host, as Envoy keeps one stat per name in the plugin's scope.
type MetricValue struct {
	Name  string
	Type  MetricType
	Value int64 // counter or gauge value; for a histogram, the number of samples
	// Histogram only: every recorded value (the first maxSamples), their count and sum.
	Samples []uint64
	Count   uint64
	Sum     uint64
}

type metric struct {
	name    string
	typ     MetricType
	value   int64
	samples []uint64
	count   uint64
	sum     uint64
}

type metrics struct {
	mu     sync.Mutex
	byName map[string]*metric
}

func newMetrics() *metrics { return &metrics{byName: map[string]*metric{}} }

// define returns the metric of that name, creating it; nil if the name has another type.
func (m *metrics) define(name string, typ MetricType) *metric {
	m.mu.Lock()
	defer m.mu.Unlock()
	if x, ok := m.byName[name]; ok {
		if x.typ != typ {
			return nil
		}
		return x
	}
	x := &metric{name: name, typ: typ}
	m.byName[name] = x
	return x
}

// increment follows Envoy: counters only go up by a positive offset, gauges add or
// subtract, histograms cannot be incremented.
func (m *metrics) increment(x *metric, offset int64) status {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch x.typ {
	case Counter:
		if offset <= 0 {
			return statusBadArgument
		}
		x.value += offset
	case Gauge:
		x.value += offset
	default:
		return statusBadArgument
	}
	return statusOK
}

// record adds to a counter, sets a gauge, records a histogram sample.
func (m *metrics) record(x *metric, v uint64) status {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch x.typ {
	case Counter:
		x.value += int64(v)
	case Gauge:
		x.value = int64(v)
	default:
		x.count++
		x.sum += v
		if len(x.samples) < maxSamples {
			x.samples = append(x.samples, v)
		}
	}
	return statusOK
}

// read returns a counter or gauge value; Envoy cannot read a histogram back.
func (m *metrics) read(x *metric) (uint64, status) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if x.typ == Histogram {
		return 0, statusBadArgument
	}
	return uint64(x.value), statusOK
}

func (m *metrics) get(name string) (MetricValue, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	x, ok := m.byName[name]
	if !ok {
		return MetricValue{}, false
	}
	return x.snapshot(), true
}

func (m *metrics) all() []MetricValue {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]MetricValue, 0, len(m.byName))
	for _, x := range m.byName {
		out = append(out, x.snapshot())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func (x *metric) snapshot() MetricValue {
	v := MetricValue{Name: x.name, Type: x.typ, Value: x.value}
	if x.typ == Histogram {
		v.Value = int64(x.count)
		v.Count, v.Sum = x.count, x.sum
		v.Samples = append([]uint64(nil), x.samples...)
	}
	return v
}

// Metrics: ids carry their type in the low two bits, as Envoy's do.

func hostDefineMetric(vm *VM, a []uint64) status {
	typ := MetricType(uint32(a[0]))
	if typ > Histogram {
		return statusBadArgument
	}
	name, ok := vm.readString(a[1], a[2])
	if !ok {
		return statusInvalidMemoryAccess
	}
	m := vm.host.metrics.define(name, typ)
	if m == nil {
		return statusBadArgument
	}
	vm.metricSeq++
	id := vm.metricSeq<<2 | uint32(typ)
	vm.metricIDs[id] = m
	return vm.writeU32(a[3], id)
}

func hostIncrementMetric(vm *VM, a []uint64) status {
	m, ok := vm.metricIDs[uint32(a[0])]
	if !ok {
		return statusNotFound
	}
	return vm.host.metrics.increment(m, int64(a[1]))
}

func hostRecordMetric(vm *VM, a []uint64) status {
	m, ok := vm.metricIDs[uint32(a[0])]
	if !ok {
		return statusNotFound
	}
	return vm.host.metrics.record(m, a[1])
}

func hostGetMetric(vm *VM, a []uint64) status {
	m, ok := vm.metricIDs[uint32(a[0])]
	if !ok {
		return statusNotFound
	}
	v, st := vm.host.metrics.read(m)
	if st != statusOK {
		return st
	}
	return vm.writeU64(a[1], v)
}
