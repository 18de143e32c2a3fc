package route

import "github.com/kvroute/kvroute/shared/table"

// Homes is where this router last sent each prefix, kept after every cache has let the
// prefix go. Where the fleet's KV caches cannot hold its working set (the usual case in
// production), a conversation's or a document's prefix is often evicted everywhere
// between two of its requests, and the table then lists it nowhere. Placed as new, the
// request goes wherever the cost is lowest at that moment, so such prefixes wander from
// replica to replica; sent back to the replica that last had it, each stays on one.
//
// So, for a model without a slower tier, where the table (with this proxy's own recent
// placements, Local) lists none of a request's prompt on the replica this router last
// sent its longest remembered prefix to, the rule counts that replica as holding Credit
// of that prefix: enough to keep the
// prefix there over a somewhat shorter queue elsewhere, not enough to beat a replica the
// table lists holding it (docs/rule.md, "Homes"; the figures in docs/performance.md).
//
// Keys are recorded every Stride blocks of the chains sent, at most MaxKeys of them in
// two generations (a full current one becomes the old one, and the old one's map,
// emptied, the current one), so the most recent placements are remembered and memory is
// bounded. Hashes and replica
// addresses only. Not safe for concurrent use: each worker VM has its own.
type Homes struct {
	// Credit is the share of the remembered prefix the home is counted as holding; 0
	// turns homes off.
	Credit float64
	// Stride is the blocks between recorded keys; MaxKeys bounds the keys held.
	Stride, MaxKeys int

	cur, old map[uint64]uint16 // key -> index in addrs
	addrs    []string
	ids      map[string]uint16
}

// Homes' defaults: 3/4 of the prefix and a key every 8 blocks (128 tokens of text at 16
// tokens a block), as measured (docs/performance.md, "Homes"), and 262,144 keys, about
// 5 MB: the trace at 4 replicas gave the same figures with them as with no bound, and
// with a quarter of them lost about half the gain.
const (
	DefaultHomeCredit  = 0.75
	DefaultHomeStride  = 8
	DefaultHomeMaxKeys = 1 << 18
	// maxHomeAddrs bounds the addresses interned: replicas come and go with their pods,
	// and past this many everything is forgotten at once.
	maxHomeAddrs = 4096
)

// NewHomes returns an empty Homes with the defaults.
func NewHomes() *Homes {
	return &Homes{Credit: DefaultHomeCredit, Stride: DefaultHomeStride, MaxKeys: DefaultHomeMaxKeys}
}

func (h *Homes) on() bool { return h != nil && h.Credit > 0 && h.Stride > 0 && h.MaxKeys > 1 }

// Add records that c was sent to addr.
func (h *Homes) Add(c *Chain, addr string) {
	if !h.on() || len(c.Keys) == 0 || addr == "" {
		return
	}
	id, ok := h.ids[addr]
	if !ok {
		if len(h.addrs) == maxHomeAddrs {
			h.cur, h.old, h.addrs, h.ids = nil, nil, nil, nil
		}
		if h.ids == nil {
			h.ids = map[string]uint16{}
		}
		id = uint16(len(h.addrs))
		h.addrs = append(h.addrs, addr)
		h.ids[addr] = id
	}
	for j := 0; j < len(c.Keys); j += h.Stride {
		if len(h.cur) >= h.MaxKeys/2 {
			// The old generation's map, emptied, becomes the current one: after the
			// first two, the request path allocates nothing.
			h.old, h.cur = h.cur, h.old
			clear(h.cur)
		}
		if h.cur == nil {
			h.cur = make(map[uint64]uint16, h.MaxKeys/2)
		}
		h.cur[c.Keys[j]] = id
	}
}

// find is the replica c's longest remembered prefix was last sent to, and that prefix's
// length in blocks; "" and 0 when none is remembered.
func (h *Homes) find(c *Chain) (string, int) {
	if !h.on() || len(h.addrs) == 0 || len(c.Keys) == 0 {
		return "", 0
	}
	for j := (len(c.Keys) - 1) / h.Stride * h.Stride; j >= 0; j -= h.Stride {
		id, ok := h.cur[c.Keys[j]]
		if !ok {
			id, ok = h.old[c.Keys[j]]
		}
		if ok {
			return h.addrs[id], j + 1
		}
	}
	return "", 0
}

// Len is the keys held (tests).
func (h *Homes) Len() int {
	if h == nil {
		return 0
	}
	return len(h.cur) + len(h.old)
}

// creditHome counts the home of c's longest remembered prefix (r.cands, indexed like
// m.Replicas) as holding Credit of it, where nothing of c is listed there in any tier,
// and returns the home's index (-1 for none credited). The credit is a preference, not
// a prediction: Decide puts the listed value back once the rule has picked, so what the
// decision predicts and queues (the ledger's tokens, the placement report's predicted
// cached tokens) and whether it spilled are what the table lists.
func (r *Router) creditHome(m *table.Model, c *Chain) int {
	if r.tiers.on {
		// A slower tier keeps what GPU memory evicts, and the table lists it there:
		// its listings return prefixes already, and a prefix listed nowhere has left
		// its home's tier too (docs/rule.md, "Homes").
		return -1
	}
	addr, blocks := r.Homes.find(c)
	i := replicaIndex(m, addr)
	if i < 0 {
		return -1
	}
	cd := &r.cands[i]
	if cd.Cached > 0 || cd.Offloaded > 0 {
		return -1
	}
	cd.Cached = min(c.Tokens(blocks), c.PromptTokens) * r.Homes.Credit
	return i
}
