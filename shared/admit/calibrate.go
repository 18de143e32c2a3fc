package admit

import "time"

// The rule's wait counts prefill compute only; under load a request also waits for KV
// memory and shares its steps with the running requests' decoding, so the proxy scales
// the rule's waits by what it observes: the ratio of the first-byte times of its
// admitted requests to the waits predicted for them, averaged over the last
// calibrationSamples (exponentially), within [minScale, maxScale].
const (
	calibrationSamples = 50
	minScale, maxScale = 0.5, 20
	// maxPending bounds the predictions kept for requests not yet started; past it they
	// are dropped (a lost stream never starts) and calibration skips them.
	maxPending = 4096
)

type prediction struct {
	at   int64   // placed, unix ns
	wait float64 // predicted Total, seconds
}

type calibration struct {
	pending          map[uint64]prediction
	observed, waited float64 // exponential averages of first-byte times and predictions
}

// scale is the factor the rule's waits are multiplied by.
func (c *calibration) scale() float64 {
	if !(c.waited > 0) {
		return 1
	}
	return min(max(c.observed/c.waited, minScale), maxScale)
}

func (c *calibration) placed(id uint64, w Wait, at time.Time) {
	if w.Total < 0 {
		return
	}
	if c.pending == nil || len(c.pending) >= maxPending {
		c.pending = make(map[uint64]prediction)
	}
	c.pending[id] = prediction{at: at.UnixNano(), wait: w.Total}
}

func (c *calibration) started(id uint64, at time.Time) {
	p, ok := c.pending[id]
	if !ok {
		return
	}
	delete(c.pending, id)
	observed := float64(at.UnixNano()-p.at) / 1e9
	if observed < 0 {
		return
	}
	const a = 1.0 / calibrationSamples
	if c.waited == 0 {
		c.observed, c.waited = observed, p.wait
		return
	}
	c.observed += a * (observed - c.observed)
	c.waited += a * (p.wait - c.waited)
}

// Started records that request id's first byte arrived at at (route.Router.Started).
func (c *Controller) Started(id uint64, at time.Time) { c.cal.started(id, at) }

// Scale is the factor the controller multiplies the rule's waits by (see calibrate.go).
func (c *Controller) Scale() float64 { return c.cal.scale() }
