package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteTable writes results as an aligned table: scenario, implementation,
// messages, msg/s, ratio to raw and latency percentiles. Combinations that
// did not run are listed under it with the reason, not as rows of dashes
// that read like failed runs.
func WriteTable(w io.Writer, results []Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\timpl\tmessages\tmsg/s\tvs raw\tp50 ms\tp90 ms\tp99 ms\t")
	last := ""
	type notRun struct{ impl, why string }
	var skipped []notRun
	skippedIn := map[notRun][]string{}
	for _, r := range results {
		if r.Skipped != "" {
			k := notRun{r.Impl, r.Skipped}
			if _, seen := skippedIn[k]; !seen {
				skipped = append(skipped, k)
			}
			skippedIn[k] = append(skippedIn[k], r.Scenario)
			continue
		}
		sc := r.Scenario
		if sc == last {
			sc = ""
		}
		last = r.Scenario
		// critical-behind-backlog measures latency only, and a ratio needs
		// a raw run: the cells stay empty rather than show placeholders.
		rate, ratio := "", ""
		if r.Scenario != ScenarioBacklog {
			rate = fmt.Sprintf("%.0f", r.MsgPerSec)
			if r.RatioToRaw > 0 {
				ratio = fmt.Sprintf("%.2f", r.RatioToRaw)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%.1f\t%.1f\t%.1f\t\n", sc, r.Impl, r.Messages, rate, ratio, r.P50ms, r.P90ms, r.P99ms)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(skipped) > 0 {
		fmt.Fprintln(w, "\nNot run:")
		for _, k := range skipped {
			fmt.Fprintf(w, "  %s in %s: %s\n", k.impl, strings.Join(skippedIn[k], ", "), k.why)
		}
	}
	_, err := fmt.Fprintln(w, `
msg/s: messages handled per second, first send to last handle. Latency: send → handle
(request-response: the request's round trip; critical-behind-backlog: the 10 critical
messages sent after the low-priority backlog; raw and Watermill have no priorities, so
theirs wait behind the backlog). Ratios compare runs of this process only.`)
	return err
}
