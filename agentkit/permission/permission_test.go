package permission_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/agentkit/permission"
)

func TestParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		give    error
		wantOK  bool
		wantOp  string
		wantSub string
	}{
		{"publish", fmt.Errorf("%w: %s", nats.ErrPermissionViolation, `Permissions Violation for Publish to "mesh.agent.x.normal.B"`), true, "publish", "mesh.agent.x.normal.B"},
		{"subscribe", fmt.Errorf("%w: %s", nats.ErrPermissionViolation, `Permissions Violation for Subscription to "_INBOX_B.>"`), true, "subscribe", "_INBOX_B.>"},
		{"queue subscribe", fmt.Errorf("%w: %s", nats.ErrPermissionViolation, `Permissions Violation for Subscription to "x.y" using queue "q"`), true, "subscribe", "x.y"},
		{"other error", errors.New("nats: timeout"), false, "", ""},
		{"nil", nil, false, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pe, ok := permission.Parse(tt.give)
			if ok != tt.wantOK {
				t.Fatalf("ok = %v, want %v", ok, tt.wantOK)
			}
			if !ok {
				return
			}
			if pe.Op != tt.wantOp || pe.Subject != tt.wantSub {
				t.Fatalf("got %s %q, want %s %q", pe.Op, pe.Subject, tt.wantOp, tt.wantSub)
			}
			if !errors.Is(pe, permission.ErrDenied) || !errors.Is(pe, nats.ErrPermissionViolation) {
				t.Fatal("error does not match both sentinels")
			}
			if !strings.Contains(pe.Error(), tt.wantSub) {
				t.Fatalf("message %q does not name the subject", pe.Error())
			}
		})
	}
}
