//go:build !linux

package host

import "time"

// threadClock falls back to wall time where the thread's CPU clock is not read.
type threadClock struct{ start time.Time }

func (c *threadClock) begin()             { c.start = time.Now() }
func (c *threadClock) end() time.Duration { return time.Since(c.start) }
