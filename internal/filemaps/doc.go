// Package filemaps holds one test: a package doc's file map ("Files:", then the files
// and what each holds) names every non-test .go file of its package and no other.
//
// A map is the paragraph or list that starts at a line beginning "Files:" in the
// comment above a package clause and runs to the next blank comment line; a doc.go
// that holds the map need not name itself. Every package in the module that has a map
// is checked; one without is not.
package filemaps
