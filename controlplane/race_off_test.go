//go:build !race

package controlplane

const raceDetector = false
