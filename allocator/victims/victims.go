// Package victims is the one rule by which reclaim picks the workloads to
// evict for an asker, for queues (allocator/queue) and for ElasticQuota
// namespaces (allocator/quota): each caller supplies its candidates in its
// own order, its own admission of a victim (guarantees, mins) and its own
// test of "enough" (the asker's real placement, GPU by GPU, with its
// topology: an NVLink clique, a node, a rack).
package victims

import (
	"slices"
	"sort"
)

// Choose takes the candidates in order, each one a fresh taker admits (a
// new taker per attempt: it keeps what was taken so far), until enough
// says the victims free enough room; enough must be monotone (a superset
// of an enough set is enough). Of that shortest enough prefix, every
// victim without which the rest is still enough is dropped, from the last
// one back, so no eviction is made that is not needed.
//
// When the candidates run out first because the taker refused some (a
// victim's queue or namespace would fall below its guarantee), the victims
// that the fewest enough set of all the candidates does not need (their
// freed room cannot serve the asker: GPUs of another clique, node or rack)
// are passed over and the choice is made again, so that the surplus
// others may give is not spent on them. It returns the victims in
// candidate order, or false when no choice is enough. key names a
// candidate.
func Choose[W any](cands []W, key func(W) string, newTaker func() func(W) bool, enough func([]W) bool) ([]W, bool) {
	if enough(nil) {
		return nil, true
	}
	cands = slices.Clone(cands)
	for {
		take := newTaker()
		var victims []W
		refused := false
		for _, w := range cands {
			if !take(w) {
				refused = true
				continue
			}
			victims = append(victims, w)
			if enough(victims) {
				return minimal(victims, enough), true
			}
		}
		useless := uselessVictims(cands, victims, refused, key, enough)
		if len(useless) == 0 {
			return nil, false
		}
		cands = slices.DeleteFunc(cands, func(w W) bool { return useless[key(w)] })
	}
}

// uselessVictims returns the victims taken (all the candidates having been
// tried, some refused) that the fewest enough set of all the candidates
// (the shortest enough prefix in candidate order, then minimal) does not
// need: their freed room does not serve the asker. None when no candidate
// was refused, or when even all of them are not enough.
func uselessVictims[W any](cands, victims []W, refused bool, key func(W) string, enough func([]W) bool) map[string]bool {
	if !refused || !enough(cands) {
		return nil
	}
	n := sort.Search(len(cands), func(k int) bool { return enough(cands[:k+1]) }) + 1
	needed := map[string]bool{}
	for _, w := range minimal(cands[:n], enough) {
		needed[key(w)] = true
	}
	out := map[string]bool{}
	for _, w := range victims {
		if !needed[key(w)] {
			out[key(w)] = true
		}
	}
	return out
}

// minimal drops, from the last victim back, each victim without which the
// others are still enough.
func minimal[W any](victims []W, enough func([]W) bool) []W {
	keep := slices.Clone(victims)
	for i := len(keep) - 2; i >= 0; i-- { // the last one was needed
		without := append(slices.Clone(keep[:i]), keep[i+1:]...)
		if enough(without) {
			keep = without
		}
	}
	return keep
}
