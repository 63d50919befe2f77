package dlq_test

import (
	"context"
	"fmt"
	"log"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/dlq"
	"github.com/agentmesh-io/agentmesh/subjects"
)

// Read the newest dead letters and send back those that timed out.
func Example() {
	ctx := context.Background()
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	letters, err := dlq.Read(ctx, js, subjects.Default, 100)
	if err != nil {
		log.Fatal(err) // errors.Is(err, dlq.ErrNoStream): no monitor has run yet
	}
	for _, l := range letters {
		if l.Status() != "TIMEOUT" {
			continue
		}
		r, err := dlq.Replay(ctx, js, subjects.Default, l)
		if err != nil {
			log.Print(err)
			continue
		}
		fmt.Printf("replayed %s (dead letter %d) to %s\n", l.MessageID(), l.Seq, r.Subject)
	}
}
