// The windowed mean the block measures report (residency.go, storedagain.go,
// fleetagain.go), and its value for a replica of several DP ranks.

package index

// recentMean is the mean of about the last window values added: their plain mean until
// window of them, then each new value weighing 1/window.
type recentMean struct {
	mean float64
	n    uint64 // values added
}

func (m *recentMean) add(x float64, window uint64) {
	m.n++
	m.mean += (x - m.mean) / float64(min(m.n, window))
}

// or is the mean, or none before any value.
func (m *recentMean) or(none float64) float64 {
	if m.n == 0 {
		return none
	}
	return m.mean
}

// addBack adds a block's outcome to a share: 1 back, 0 not.
func (m *recentMean) addBack(back bool, window uint64) {
	x := 0.0
	if back {
		x = 1
	}
	m.add(x, window)
}

// meanOverRanks is a replica's value of one measure (of picks it from a rank) over its
// ranks, each weighted by the values its mean stands for (at most window); -1 before
// any.
func meanOverRanks(ranks []*rank, window uint64, of func(*rank) *recentMean) float64 {
	var sum, n float64
	for _, rk := range ranks {
		m := of(rk)
		w := float64(min(m.n, window))
		sum += m.mean * w
		n += w
	}
	if n == 0 {
		return -1
	}
	return sum / n
}
