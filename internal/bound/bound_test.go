package bound_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/agentmesh-io/agentmesh/internal/bound"
)

func TestClip(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{strings.Repeat("a", 30), 20, "aaaaaa…(truncated)"},
		{"aaaaa" + strings.Repeat("é", 10), 20, "aaaaa…(truncated)"}, // the cut falls inside an é
		{"bad\xffbyte", 20, "bad\uFFFDbyte"},
		{strings.Repeat("a", 30), 5, "…(truncated)"}, // below the mark: the mark alone
	} {
		got := bound.Clip(c.in, c.n)
		if got != c.want || !utf8.ValidString(got) {
			t.Errorf("Clip(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}

func TestQuote(t *testing.T) {
	t.Parallel()
	if got := bound.Quote("a\"b"); got != `"a\"b"` {
		t.Errorf("Quote short = %s", got)
	}
	long := strings.Repeat("x", 1000)
	got := bound.Quote(long)
	if len(got) > bound.MaxQuotedBytes+40 || !strings.HasSuffix(got, " (1000 bytes)") {
		t.Errorf("Quote long = %s", got)
	}
}

func TestHasControl(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]bool{"plain id": false, "é ü": false, "a\r\nb": true, "tab\t": true, "del\x7f": true, "c1\u0085": true} {
		if got := bound.HasControl(s); got != want {
			t.Errorf("HasControl(%q) = %v, want %v", s, got, want)
		}
	}
}
