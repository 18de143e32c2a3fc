package route

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/rule"
)

func followUp(prev, question string) []byte {
	return []byte(fmt.Sprintf(`{"model":"llama","previous_response_id":%q,"input":%q}`, prev, question))
}

// A Responses follow-up goes to the replica that stored the previous response, even
// when the rule would pick another (here the least-queued one); when that replica is
// unhealthy or unknown the rule decides and the result says the follow-up was lost.
func TestFollowUpGoesToTheReplicaThatStoredItsResponse(t *testing.T) {
	m := model(t, 4)
	for i := range m.Replicas {
		m.Replicas[i].Queued = uint64(1000 * (4 - i)) // replica 3 is the least queued
	}
	tb := tableOf(m)
	r := exactRouter()
	stored := map[string]string{"resp_a": m.Replicas[1].Addr, "resp_gone": "10.9.9.9:8000"}
	var asked []string
	r.Follows = func(id []byte, tenant string) string {
		asked = append(asked, tenant+"/"+string(id))
		return stored[string(id)]
	}
	now := time.Now()
	route := func(id uint64, body []byte) (Decision, Result) {
		d, res := r.Route(tb, &Request{ID: id, Schema: prompt.Responses, Body: body, Tenant: "t1"}, 50*time.Millisecond, now)
		require.NotEqual(t, Unrouted, res.Action)
		return d, res
	}

	d, res := route(1, followUp("resp_a", "next step"))
	assert.Equal(t, m.Replicas[1].Addr, d.Addrs[0])
	assert.Equal(t, Followed, res.Follow)
	assert.Equal(t, []string{"t1/resp_a"}, asked)
	assert.Len(t, d.Addrs, 3, "retry targets kept")

	d, res = route(2, followUp("resp_unknown", "next step"))
	assert.Equal(t, m.Replicas[3].Addr, d.Addrs[0], "the rule's pick")
	assert.Equal(t, FollowLost, res.Follow)
	_, res = route(3, followUp("resp_gone", "next step"))
	assert.Equal(t, FollowLost, res.Follow, "a replica no longer in the table")

	m.Replicas[1].Healthy = false
	d, res = route(4, followUp("resp_a", "next step"))
	assert.NotEqual(t, m.Replicas[1].Addr, d.Addrs[0])
	assert.Equal(t, FollowLost, res.Follow)

	_, res = route(5, []byte(`{"model":"llama","input":"fresh"}`))
	assert.Equal(t, NoFollow, res.Follow)
}

// A session's previous replica is credited with the best match: with the session's
// prefix unknown to the table (another API's body, a parser that could not read it)
// the request still goes there while the rule's cost allows, and not once its queue
// outweighs the saving.
func TestSessionPrefersItsReplicaWhileTheCostAllows(t *testing.T) {
	system := strings.Repeat("An agent's long running context. ", 400)
	m := model(t, 3)
	tb := tableOf(m)
	r := exactRouter()
	now := time.Now()
	route := func(id uint64, session string) Decision {
		d, _ := r.Route(tb, &Request{ID: id, Schema: prompt.Chat, Body: chatBody(system, fmt.Sprint("turn ", id)),
			Session: session, SessionBlocks: len(system) / int(cfg.BlockBytes)}, 50*time.Millisecond, now)
		r.Ledger.Done(id)
		// The table has not learned the session's prefix, nor has this proxy sent it.
		r.Local, r.HomeCredit = NewLocal(), DefaultHomeCredit
		return d
	}
	m.Replicas[0].Queued, m.Replicas[1].Queued, m.Replicas[2].Queued = 3000, 2000, 0
	assert.Equal(t, m.Replicas[2].Addr, route(1, "").Addrs[0], "no session: the least queued")
	assert.Equal(t, m.Replicas[1].Addr, route(2, m.Replicas[1].Addr).Addrs[0], "the session's replica")
	m.Replicas[1].Queued = 200000
	assert.Equal(t, m.Replicas[2].Addr, route(3, m.Replicas[1].Addr).Addrs[0], "too deep a queue")

	// Without a prompt to match, the session's replica first while healthy.
	m.Replicas[1].Queued = 3000
	d, res := r.Route(tb, &Request{ID: 9, Schema: prompt.Chat, Body: []byte(`{"model":"llama",`), Session: m.Replicas[1].Addr}, 50*time.Millisecond, now)
	require.Equal(t, NoPrompt, res.Action)
	assert.Equal(t, m.Replicas[1].Addr, d.Addrs[0])
}

func TestPinFirst(t *testing.T) {
	assert.Equal(t, []int{2, 0, 1}, pinFirst([]int{0, 1, 2}, 2, 3))
	assert.Equal(t, []int{5, 0, 1}, pinFirst([]int{0, 1, 2}, 5, 3), "the last retry target makes room")
	assert.Equal(t, []int{5, 0}, pinFirst([]int{0}, 5, 3))
	assert.Equal(t, []int{1, 0, 2}, pinFirst([]int{0, 1, 2}, 1, 3))
	assert.Equal(t, []int{4}, pinFirst(nil, 4, 3))
}

// A session's previous replica is credited with the previous prompt as this prompt's
// chain counts it. The bytes per token the table carries move (the control plane learns
// them from outcomes), and a credit kept in tokens at the old ratio fell below what a
// replica holding only the shared system prompt counts at the new one, which then took
// the session.
func TestSessionCreditSurvivesANewBytesPerToken(t *testing.T) {
	system := strings.Repeat("You are the ACME support assistant. ", 100)
	question := strings.Repeat("My order has not arrived yet. ", 10)
	m := model(t, 2)
	m.Config.BytesPerToken = 4
	hold(t, m, chainOf(t, chatBody(system, "another customer's question"), Identity{Model: "llama"}), 0)
	tb := tableOf(m)
	r := NewRouter(rule.DefaultParams(), 1)
	now := time.Now()
	first, _ := r.Route(tb, &Request{ID: 1, Schema: prompt.Chat, Body: chatBody(system, question)}, 50*time.Millisecond, now)
	r.Ledger.Done(1)
	r.Local = NewLocal() // the session's turn went to replica 1; the table has not learned it

	m.Config.BytesPerToken = 3
	next := chatBody(system, question+" Where is it now?")
	for id := uint64(2); id < 12; id++ {
		d, _ := r.Route(tb, &Request{ID: id, Schema: prompt.Chat, Body: next,
			Session: m.Replicas[1].Addr, SessionBlocks: first.Blocks}, 50*time.Millisecond, now)
		r.Ledger.Done(id)
		r.Local = NewLocal()
		require.Equal(t, m.Replicas[1].Addr, d.Addrs[0], "request %d left its session", id)
	}
}
