//go:build race

package controlplane

// raceDetector: the race detector multiplies a process's memory (Go's docs: 5-10x) and
// CPU time (2-20x), so memory ceilings and freshness guards do not apply under it.
const raceDetector = true
