package blocklru

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestLeastRecentlyUsedGoesFirst(t *testing.T) {
	l := New(2)
	_, ev := l.Add(1)
	assert.False(t, ev)
	l.Add(2)
	assert.True(t, l.Touch(1))
	h, ev := l.Add(3)
	assert.True(t, ev)
	assert.Equal(t, uint64(2), h, "least recently used goes first")
	assert.False(t, l.Touch(2))
	assert.False(t, l.Has(2))
	assert.True(t, l.Has(1))
	assert.True(t, l.Has(3))

	// Has does not touch: 1 is still the least recently used.
	h, _ = l.Add(4)
	assert.Equal(t, uint64(1), h)
}

func TestCapacityIsAtLeastOne(t *testing.T) {
	l := New(0)
	l.Add(1)
	h, ev := l.Add(2)
	assert.True(t, ev)
	assert.Equal(t, uint64(1), h)
	assert.True(t, l.Has(2))
}

func TestFullAddAllocatesNothing(t *testing.T) {
	l := New(64)
	for h := range uint64(64) {
		l.Add(h)
	}
	next := uint64(64)
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		l.Add(next)
		next++
	}))
}
