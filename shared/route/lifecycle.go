package route

import "time"

// The calls a proxy makes on its router besides Route: a routed request's start and end,
// the placements of the proxy's other routers (the filter's sibling worker VMs,
// filter/placed.go), and the expiry it runs on its tick. The filter and the fleet
// simulator make the same calls, so their ledgers and Locals age alike.

// Started records that request id's prefill is done (its first response byte arrived
// at at): Ledger.Started, and the admission's calibration (admit.Controller.Started).
func (r *Router) Started(id uint64, at time.Time) {
	if r.Admit != nil {
		r.Admit.Started(id, at)
	}
	r.Ledger.Started(id, at)
}

// Done ends request id's ledger entry: the request ended, or was never forwarded to the
// replica Route picked (Ledger.Done).
func (r *Router) Done(id uint64) { r.Ledger.Done(id) }

// AddPeer records a placement another router of the same proxy made at at: its keys in
// Local (those it recorded in its own, Result.LocalKeys), unless the placement is older
// than Local.MaxAge, and, while it is younger than queued, its prefill tokens in the
// ledger under id (Ledger.AddPeer), which must not be an id of this router's requests.
func (r *Router) AddPeer(id uint64, model string, keys []uint64, addr string, tokens float64, at, now time.Time,
	queued time.Duration) {
	if now.Sub(at) > r.Local.MaxAge {
		return
	}
	r.Local.Add(model, keys, addr, at)
	if now.Sub(at) < queued {
		r.Ledger.AddPeer(id, addr, tokens, at)
	}
}

// ExpirePeers drops the ledger's entries of other routers sent before cutoff, and says
// how many (Ledger.ExpirePeers).
func (r *Router) ExpirePeers(cutoff time.Time) int { return r.Ledger.ExpirePeers(cutoff) }

// Expire drops the ledger's entries sent before cutoff and says how many had not started:
// streams whose end was never seen (Ledger.Expire).
func (r *Router) Expire(cutoff time.Time) int { return r.Ledger.Expire(cutoff) }

// Prune drops Local's placements that a table confirmed current at confirmed has had the
// chance to learn (Local.Prune).
func (r *Router) Prune(confirmed, now time.Time) { r.Local.Prune(confirmed, now) }
