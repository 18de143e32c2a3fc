package route

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestHoldForTable(t *testing.T) {
	wait := 500 * time.Millisecond
	assert.True(t, HoldForTable(0, wait, 0, false), "a proxy's first request")
	assert.True(t, HoldForTable(499*time.Millisecond, wait, MaxHeldForTable-1, false))
	assert.False(t, HoldForTable(wait, wait, 0, false), "the window is over: Envoy decides at once")
	assert.False(t, HoldForTable(wait, wait, 0, true), "... and releases the held")
	assert.False(t, HoldForTable(0, wait, MaxHeldForTable, false), "the list is full")
	assert.True(t, HoldForTable(0, wait, MaxHeldForTable, true), "a held request stays held while the window lasts")
	assert.False(t, HoldForTable(0, 0, 0, false), "first_table_wait_ms negative: never held")
}
