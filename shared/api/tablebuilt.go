package api

import "time"

// TableBuilt is when an answered table version was built, on the poller's clock, at the
// earliest it can have been: the control plane answered held after the poll arrived,
// which was after sent, and the version was age old then. Dated from when the answer
// came back (now), the version would be as much younger than it is as the answer took
// to return, several milliseconds on a loaded proxy. held < 0 (a control plane that
// does not say how long it held a long poll): the answer is taken to have left at now.
func TableBuilt(sent, now time.Time, age, held time.Duration) time.Time {
	left := now
	if held >= 0 && !sent.IsZero() {
		if t := sent.Add(held); t.Before(now) {
			left = t
		}
	}
	return left.Add(-age)
}
