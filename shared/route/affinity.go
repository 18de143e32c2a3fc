package route

import "github.com/kvroute/kvroute/shared/table"

// Affinity. A Responses request naming previous_response_id continues a conversation
// the body does not carry: the engine that answered the previous response rebuilds it
// from its store, which in vLLM is a dictionary of that API server process
// (vllm/entrypoints/openai/responses/serving.py, response_store), so on any other
// replica the request fails (404, not found). Such a request goes to that replica first
// whenever the table lists it healthy, whatever the cost; the rule orders the rest, and
// decides alone when the replica is unknown, gone or unhealthy.
//
// A session (a header the mesh trusts, api.Config.SessionHeader) is softer: its previous
// replica served the session's last request, whose prompt an agent's next request
// extends, so that replica is credited with that many blocks cached (or the best match
// among the replicas, if more) even where the table has not learned them (another API's
// body, a prefix past what the table lists), and the rule's cost decides as usual; a
// request without a prompt to match goes there first while it is healthy. Neither id is
// trusted for anything but this ordering.

// affinity is what Route learned about one request before deciding.
type affinity struct {
	named   bool   // the request names a previous response and Router.Follows is set
	follow  string // the replica that stored the response the request continues
	session string // the replica of the session's previous request
	// sessionBlocks is that request's complete blocks.
	sessionBlocks int
}

// affinityOf looks up the replica that stored previousResponseID (Router.Follows).
func (r *Router) affinityOf(previousResponseID []byte, req *Request) affinity {
	a := affinity{session: req.Session, sessionBlocks: req.SessionBlocks}
	if r.Follows != nil && previousResponseID != nil {
		a.named, a.follow = true, r.Follows(previousResponseID, req.Tenant)
	}
	return a
}

// replicaIndex is addr's index among m's healthy replicas, -1 if it is not one.
func replicaIndex(m *table.Model, addr string) int {
	if addr == "" {
		return -1
	}
	for i := range m.Replicas {
		if m.Replicas[i].Addr == addr {
			if !m.Replicas[i].Healthy {
				return -1
			}
			return i
		}
	}
	return -1
}

// creditSession raises the session replica's cached tokens to its previous prompt's (at
// most this one's) or the best match among the candidates (r.cands, indexed like
// m.Replicas). The previous prompt is counted in c's blocks at c's bytes per token, as
// the matches are, so that a ratio the control plane learns since moves both alike
// (TestSessionCreditSurvivesANewBytesPerToken).
func (r *Router) creditSession(m *table.Model, c *Chain) {
	s := replicaIndex(m, r.aff.session)
	if s < 0 {
		return
	}
	best := c.Tokens(min(r.aff.sessionBlocks, len(c.Keys)))
	for i := range r.cands {
		best = max(best, r.cands[i].Cached)
	}
	if c := &r.cands[s]; c.Cached < best {
		c.Cached, c.Offloaded, c.LoadCost = best, 0, 0
	}
}

// pinFirst puts replica i first in order, keeping the others' order and the length
// limit max (the pick plus retry targets).
func pinFirst(order []int, i, max int) []int {
	if len(order) == 0 {
		return append(order, i)
	}
	at := -1
	for j, o := range order {
		if o == i {
			at = j
			break
		}
	}
	if at < 0 {
		if len(order) < max {
			order = append(order, i)
		}
		at = len(order) - 1
	}
	copy(order[1:at+1], order[:at])
	order[0] = i
	return order
}

// followOutcome is Result.Follow for a request sent to pick.
func (r *Router) followOutcome(pick string) FollowOutcome {
	switch {
	case !r.aff.named:
		return NoFollow
	case r.aff.follow != "" && r.aff.follow == pick:
		return Followed
	}
	return FollowLost
}
