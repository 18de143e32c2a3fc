package api

import (
	"encoding/binary"
	"errors"
)

// Response affinity across proxies. Each filter learns which replica answered each
// Responses response (filter/affinity.go) and tells the control plane in the outcome
// report of that answer (Report.Affinity: the key below, never the id); the control plane
// keeps the newest entries (controlplane/affinity) and every proxy's leader fetches those
// it has not seen:
//
//	GET AffinityPath?since=S&epoch=E&proxy=P
//
// answers the entries after cursor S of epoch E (all it holds when E is not its epoch,
// after a restart or on another replica), leaving out those proxy P reported, in
// AffinityContentType: the magic "KVAF", a version byte (1), the answer's epoch and the
// cursor to send next (uint64s, little endian), then entries to the end of the body:
//
//	key       8 bytes, little endian (AffinityKey)
//	age_ms    4 bytes, little endian: how long ago the control plane received it
//	replica   1 byte length, then the address ("ip:port")
//
// Ages, not times: a relative age needs no clock agreement between the machines.
const (
	AffinityPath        = "/v1/affinity"
	AffinityContentType = "application/vnd.kvroute.affinity"
	// MaxAffinityAnswer is the most entries in one answer; the rest come on the next poll.
	MaxAffinityAnswer = 4096
	// MaxAffinityAnswerBytes is the longest answer: that many entries of 255-byte addresses.
	MaxAffinityAnswerBytes = AffinityHeadLen + MaxAffinityAnswer*(affinityEntry+255)
)

// Kinds of affinity entries (the first byte AffinityKey hashes).
const (
	AffinityResponse byte = 'R'
	AffinitySession  byte = 'S'
)

const (
	affinityMagic   = "KVAF"
	affinityVersion = 1
	// AffinityHeadLen is an answer's fixed head: magic, version, epoch, cursor.
	AffinityHeadLen = len(affinityMagic) + 1 + 8 + 8
	affinityEntry   = 8 + 4 + 1
)

// AffinityKey hashes an entry's identity (FNV-1a, 64 bits; never 0): the same in every
// proxy, so an id learned in one is found in another while the id itself stays there.
func AffinityKey(kind byte, tenant string, id []byte) uint64 {
	const prime = 1099511628211
	h := uint64(14695981039346656037)
	h = (h ^ uint64(kind)) * prime
	for i := 0; i < len(tenant); i++ {
		h = (h ^ uint64(tenant[i])) * prime
	}
	h = (h ^ 0xff) * prime // tenant and id apart
	for _, c := range id {
		h = (h ^ uint64(c)) * prime
	}
	return max(h, 1)
}

// AppendAffinityHead starts an answer of epoch whose next cursor is next.
func AppendAffinityHead(dst []byte, epoch, next uint64) []byte {
	dst = append(dst, affinityMagic...)
	dst = append(dst, affinityVersion)
	dst = binary.LittleEndian.AppendUint64(dst, epoch)
	return binary.LittleEndian.AppendUint64(dst, next)
}

// AppendAffinityEntry appends one entry; a replica address longer than 255 bytes is not
// an address and is left out.
func AppendAffinityEntry(dst []byte, key uint64, ageMs uint32, replica string) []byte {
	if len(replica) > 255 {
		return dst
	}
	dst = binary.LittleEndian.AppendUint64(dst, key)
	dst = binary.LittleEndian.AppendUint32(dst, ageMs)
	dst = append(dst, byte(len(replica)))
	return append(dst, replica...)
}

var errAffinityAnswer = errors.New("affinity answer: not a version 1 answer")

// ParseAffinityHead reads an answer's epoch and next cursor and returns its entries.
func ParseAffinityHead(b []byte) (epoch, next uint64, entries []byte, err error) {
	if len(b) < AffinityHeadLen || string(b[:len(affinityMagic)]) != affinityMagic || b[len(affinityMagic)] != affinityVersion {
		return 0, 0, nil, errAffinityAnswer
	}
	b = b[len(affinityMagic)+1:]
	return binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:]), b[16:], nil
}

// NextAffinityEntry decodes the first of entries and returns the rest; ok is false at
// the end, and for a torn entry (what is left is then not read).
func NextAffinityEntry(entries []byte) (key uint64, ageMs uint32, replica, rest []byte, ok bool) {
	if len(entries) < affinityEntry {
		return 0, 0, nil, nil, false
	}
	n := affinityEntry + int(entries[affinityEntry-1])
	if len(entries) < n {
		return 0, 0, nil, nil, false
	}
	return binary.LittleEndian.Uint64(entries), binary.LittleEndian.Uint32(entries[8:]), entries[affinityEntry:n], entries[n:], true
}

// ProxyKey is how an affinity poll names its proxy (the proxy parameter, in decimal): the
// control plane leaves out the entries of the batches posted under that name
// (ReportBatch.Proxy), which the proxy learned itself.
func ProxyKey(name string) uint64 { return AffinityKey('P', name, nil) }

// PutAffinityNext sets the cursor of an answer AppendAffinityHead started.
func PutAffinityNext(answer []byte, next uint64) {
	binary.LittleEndian.PutUint64(answer[AffinityHeadLen-8:], next)
}

// AffinityEntry is one entry of an answer, decoded.
type AffinityEntry struct {
	Key     uint64
	AgeMs   uint32
	Replica string
}

// ParseAffinityAnswer decodes a whole answer (the filter reads one entry at a time,
// NextAffinityEntry, without allocating).
func ParseAffinityAnswer(b []byte) (epoch, next uint64, es []AffinityEntry, err error) {
	epoch, next, entries, err := ParseAffinityHead(b)
	for err == nil {
		k, age, addr, rest, ok := NextAffinityEntry(entries)
		if !ok {
			break
		}
		es, entries = append(es, AffinityEntry{k, age, string(addr)}), rest
	}
	return epoch, next, es, err
}
