package ackmonitor

import (
	"fmt"
	"testing"
	"time"

	"github.com/agentmesh-io/agentmesh/ackmonitor/store"
)

// Made-up receivers cannot grow the metric's labels or the API's list
// without bound: past maxUnknownLabels receivers the messages count as
// OtherReceivers, past maxUnknownListed the oldest leaves the list.
func TestUnknownReceivers_Bounded(t *testing.T) {
	m := newMetrics()
	u := newUnknownReceivers(&Config{}, nil, m)
	at := time.Now()
	n := maxUnknownListed + 20
	for i := range n {
		u.record(store.Send{Receiver: fmt.Sprintf("ghost%03d", i), SentAt: at.Add(time.Duration(i) * time.Millisecond)})
	}
	families, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "ackmonitor_messages_to_unknown_agents_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			counts[s.GetLabel()[0].GetValue()] = s.GetCounter().GetValue()
		}
	}
	if len(counts) != maxUnknownLabels+1 {
		t.Errorf("%d label values, want %d and %q", len(counts), maxUnknownLabels, OtherReceivers)
	}
	if got := counts[OtherReceivers]; got != float64(n-maxUnknownLabels) {
		t.Errorf("%s counted %v, want %d", OtherReceivers, got, n-maxUnknownLabels)
	}
	l := u.list()
	if len(l) != maxUnknownListed || l[0].Receiver != fmt.Sprintf("ghost%03d", n-1) || l[len(l)-1].Receiver != "ghost020" {
		t.Errorf("list of %d from %s to %s, want the latest %d", len(l), l[0].Receiver, l[len(l)-1].Receiver, maxUnknownListed)
	}
}
