package bench

import (
	"os"
	"strings"
	"testing"
)

// TestProgress_TerminalRedrawsPlainWritesLines checks both displays: a
// terminal's line is redrawn with carriage returns and ended once; plain
// progress is whole lines only.
func TestProgress_TerminalRedrawsPlainWritesLines(t *testing.T) {
	t.Parallel()
	for _, tty := range []bool{true, false} {
		var out strings.Builder
		p := startProgress(&out, tty, "sc / impl")
		m := newMeasurement(4)
		p.track(m)
		m.record(0)
		p.stop()
		got := out.String()
		if !strings.HasSuffix(got, "1/4\n") && !strings.HasSuffix(got, "1/4   \n") {
			t.Errorf("tty %v: last state not shown: %q", tty, got)
		}
		if strings.Contains(got, "\r") != tty {
			t.Errorf("tty %v: carriage returns %v: %q", tty, !tty, got)
		}
		if !tty && got != "sc / impl: setting up\nsc / impl: 1/4\n" {
			t.Errorf("plain progress %q", got)
		}
	}
}

func TestIsTerminal_PipeAndBufferAreNot(t *testing.T) {
	t.Parallel()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if isTerminal(w) || isTerminal(&strings.Builder{}) || isTerminal(nil) {
		t.Error("a pipe, a buffer or nil taken for a terminal")
	}
}
