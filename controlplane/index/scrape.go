package index

import (
	"time"

	"github.com/kvroute/kvroute/controlplane/scrape"
)

// ApplyScrape records one scrape of replica id: a sample, or err.
func (ix *Index) ApplyScrape(id string, s scrape.Sample, err error, now time.Time) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	r := ix.replicas[id]
	if r == nil {
		return
	}
	if err != nil {
		r.fails++
		r.scrapeErrs++
		r.lastScrapeErr = err.Error()
		if r.fails >= ix.cfg.UnhealthyAfter {
			r.healthy = false
		}
		return
	}
	r.mu.Lock()
	r.sample, r.scrapedOK, r.lastOK, r.fails, r.healthy = s, true, now, 0, true
	ix.scraped = true
	r.placed.fit(s.Waiting + s.Running)
	ix.noteLoad(r, now)
	r.keyed.note(&r.sample, now)
	ix.fitCapacity(r, nil)
	ix.unlockReplica(r)
}
