// Matching a request's chain of keys against a model's entries, GPU only or with slower
// tiers at their load cost.

package table

// Match finds, for each replica, how many blocks of the chain keys (every key of the
// request's chain, in order) it holds: matched[i] is for Replicas[i], in blocks, and is
// a multiple of the stride. A replica holds a block when the table lists it on that
// block's checkpoint key; the longest such checkpoint counts. matched is reused when it
// has room. The result's largest value is returned too.
func (m *Model) Match(keys []uint64, matched []int) ([]int, int) {
	matched = resize(matched, len(m.Replicas))
	stride := int(m.Config.Stride)
	if stride < 1 {
		stride = 1
	}
	longest := 0
	for i := stride - 1; i < len(keys); i += stride {
		id, ok := m.entries.get(keys[i])
		if !ok {
			continue
		}
		for _, s := range m.entries.pool.get(id) {
			if r := m.ReplicaIndex(s); r >= 0 {
				matched[r] = i + 1
			}
		}
		longest = i + 1
	}
	return matched, longest
}

// Hit is a checkpoint of a chain that a replica holds on the GPU: Block is its position
// in the chain, Replica the replica's index in Replicas.
type Hit struct{ Block, Replica int32 }

// MatchHits appends to hits every checkpoint of keys from position from on that a
// replica holds, in the chain's order: Match's answer is, for each replica, its last
// hit's Block plus 1. A caller that remembers the hits of a chain (route's match memo)
// reads the table only past the part a new chain shares with it, while Gen is unchanged.
func (m *Model) MatchHits(keys []uint64, from int, hits []Hit) []Hit {
	stride := int(m.Config.Stride)
	if stride < 1 {
		stride = 1
	}
	i := stride - 1
	if from > i {
		i += (from - i + stride - 1) / stride * stride // the first checkpoint at or past from
	}
	for ; i < len(keys); i += stride {
		id, ok := m.entries.get(keys[i])
		if !ok {
			continue
		}
		for _, s := range m.entries.pool.get(id) {
			if r := m.ReplicaIndex(s); r >= 0 {
				hits = append(hits, Hit{int32(i), int32(r)})
			}
		}
	}
	return hits
}

// MatchOfHits is Match's answer from a chain's hits (MatchHits from position 0, in
// order): for each of m's replicas, its last hit's Block plus 1. matched is reused when
// it has room.
func (m *Model) MatchOfHits(hits []Hit, matched []int) []int {
	matched = resize(matched, len(m.Replicas))
	for _, h := range hits {
		matched[h.Replica] = int(h.Block) + 1
	}
	return matched
}

// MatchTiers is Match plus the slower tiers. matched is as Match gives it (GPU holders
// only). For each replica, loadable[i] is how many blocks past matched[i] it holds in
// slower tiers without a gap (vLLM looks up its offloaded blocks from the first block
// the GPU misses and stops at the first one it lacks), and loadCost[i] is those blocks
// weighted by their tier's cost: ratios[t-1] for tier t (a missing ratio counts 1, as
// if uncached). The slices are reused when they have room.
func (m *Model) MatchTiers(keys []uint64, ratios []float64, matched, loadable []int, loadCost []float64) ([]int, []int, []float64) {
	n := len(m.Replicas)
	matched = resize(matched, n)
	loadable = resize(loadable, n) // during the walk: end of the covered run, in blocks
	if cap(loadCost) < n {
		loadCost = make([]float64, n)
	}
	loadCost = loadCost[:n]
	clear(loadCost)
	stride := int(m.Config.Stride)
	if stride < 1 {
		stride = 1
	}
	for i := stride - 1; i < len(keys); i += stride {
		id, ok := m.entries.get(keys[i])
		if !ok {
			continue
		}
		for _, h := range m.entries.pool.get(id) {
			sl, tier := SplitHolder(h)
			r := m.ReplicaIndex(sl)
			if r < 0 {
				continue
			}
			switch {
			case tier == 0:
				matched[r], loadable[r], loadCost[r] = i+1, i+1, 0
			case loadable[r] == i+1-stride: // contiguous with what r already covers
				ratio := 1.0
				if tier <= len(ratios) {
					ratio = ratios[tier-1]
				}
				loadable[r], loadCost[r] = i+1, loadCost[r]+float64(stride)*ratio
			}
		}
	}
	for r := range loadable {
		loadable[r] -= matched[r]
	}
	return matched, loadable, loadCost
}

func resize(s []int, n int) []int {
	if cap(s) < n {
		s = make([]int, n)
	}
	s = s[:n]
	clear(s)
	return s
}
