package controlplane

import (
	"github.com/kvroute/kvroute/controlplane/kvevents"
	"github.com/prometheus/client_golang/prometheus"
)

// countedEvents hands KV events to the index and counts every message the
// subscriptions drop, by why (kvevents.DropReason): malformed, or over one of the
// decoder's and the replay's bounds.
type countedEvents struct {
	kvevents.Handler
	dropped *prometheus.CounterVec
	warm    *warmup // told of each stream read through its replay
}

func newCountedEvents(h kvevents.Handler, reg prometheus.Registerer) countedEvents {
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_controlplane_kv_event_dropped_total",
		Help: "KV-event messages dropped, by reason: malformed, or the bound they exceeded (events, blocks, tokens, extra_keys in one batch; replay_bytes of one replay's reply)."},
		[]string{"reason"})
	for _, r := range kvevents.DropReasons {
		dropped.WithLabelValues(r)
	}
	reg.MustRegister(dropped)
	return countedEvents{Handler: h, dropped: dropped}
}

func (h countedEvents) Connected(id kvevents.StreamID, up bool) {
	if up && h.warm != nil {
		h.warm.connected(id)
	}
	h.Handler.Connected(id, up)
}

func (h countedEvents) DecodeError(id kvevents.StreamID, err error) {
	h.dropped.WithLabelValues(kvevents.DropReason(err)).Inc()
	h.Handler.DecodeError(id, err)
}
