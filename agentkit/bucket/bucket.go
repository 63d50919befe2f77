// Package bucket opens the KV buckets and object stores of a mesh and
// runs compare-and-swap updates on KV keys. It owns the two idioms every
// store of the mesh shares: create-or-bind (a caller that provisions
// creates a missing bucket; one that does not only binds, and a missing
// bucket is an error matching jetstream.ErrBucketNotFound) and the retry
// loop of a read-modify-write that lost to a concurrent writer.
package bucket

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/subjects"
)

// ErrInvalid: a nil JetStream or a negative replica count.
var ErrInvalid = errors.New("bucket: invalid argument")

// ErrTooFewReplicas: a stream or bucket exists with fewer replicas than
// the caller asked for. Opening never changes what exists, and a store
// running on fewer replicas than its users believe loses what they think
// is safe when one server fails; scale it up (agentmesh streams
// --replicas N) or ask for what it has.
var ErrTooFewReplicas = errors.New("too few replicas")

// CheckReplicas returns an error matching [ErrTooFewReplicas] when stream
// has fewer than want replicas; it looks the stream up only for want > 1.
func CheckReplicas(ctx context.Context, js jetstream.JetStream, stream string, want int) error {
	if want <= 1 {
		return nil
	}
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", stream, err)
	}
	return EnoughReplicas(stream, st.CachedInfo().Config.Replicas, want)
}

// EnoughReplicas returns an error matching [ErrTooFewReplicas] when have,
// stream's replica count, is below want.
func EnoughReplicas(stream string, have, want int) error {
	if have >= want {
		return nil
	}
	return fmt.Errorf("%w: stream %s has %d, %d asked for (agentmesh streams --replicas %d scales it up)",
		ErrTooFewReplicas, stream, max(have, 1), want, want)
}

// KeyValue binds to the KV bucket cfg names. When provision is true a
// missing bucket is created with cfg (replicas 0 means 1); an existing one
// is used as it is, whatever its configuration, unless it has fewer
// replicas than cfg asks for ([ErrTooFewReplicas]). Without provisioning a
// missing bucket is an error matching jetstream.ErrBucketNotFound. It
// starts no goroutine.
func KeyValue(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig, provision bool) (jetstream.KeyValue, error) {
	if err := check(js, cfg.Replicas); err != nil {
		return nil, err
	}
	kv, err := open(ctx, cfg.Bucket, provision,
		func() (jetstream.KeyValue, error) { return js.KeyValue(ctx, cfg.Bucket) },
		func() (jetstream.KeyValue, error) { return js.CreateKeyValue(ctx, cfg) })
	if err == nil {
		err = CheckReplicas(ctx, js, subjects.KVStream(cfg.Bucket), cfg.Replicas)
	}
	if err != nil {
		return nil, err
	}
	return kv, nil
}

// ObjectStore is [KeyValue] for an object store.
func ObjectStore(ctx context.Context, js jetstream.JetStream, cfg jetstream.ObjectStoreConfig, provision bool) (jetstream.ObjectStore, error) {
	if err := check(js, cfg.Replicas); err != nil {
		return nil, err
	}
	obs, err := open(ctx, cfg.Bucket, provision,
		func() (jetstream.ObjectStore, error) { return js.ObjectStore(ctx, cfg.Bucket) },
		func() (jetstream.ObjectStore, error) { return js.CreateObjectStore(ctx, cfg) })
	if err == nil {
		err = CheckReplicas(ctx, js, subjects.ObjectStream(cfg.Bucket), cfg.Replicas)
	}
	if err != nil {
		return nil, err
	}
	return obs, nil
}

func check(js jetstream.JetStream, replicas int) error {
	if js == nil {
		return fmt.Errorf("%w: nil JetStream", ErrInvalid)
	}
	if replicas < 0 {
		return fmt.Errorf("%w: replicas %d < 0", ErrInvalid, replicas)
	}
	return nil
}

// open binds with bind and, when provisioning, creates a missing bucket
// with create.
func open[T any](ctx context.Context, name string, provision bool, bind, create func() (T, error)) (T, error) {
	b, err := bind()
	if provision && errors.Is(err, jetstream.ErrBucketNotFound) {
		b, err = create()
		if errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			// Another process created it between the two calls.
			b, err = bind()
		}
	}
	if err != nil {
		var zero T
		if !provision {
			return zero, fmt.Errorf("bucket %s (not created without provisioning): %w", name, err)
		}
		return zero, fmt.Errorf("bucket %s: %w", name, err)
	}
	return b, nil
}

// PayloadTTL bounds how long an offloaded envelope is kept when nobody
// acks it: the message stream's retention.
const PayloadTTL = 7 * 24 * time.Hour

// Payloads is the configuration of the object store of scheme that holds
// envelopes above the server's max payload, with replicas copies.
func Payloads(scheme subjects.Scheme, replicas int) jetstream.ObjectStoreConfig {
	return jetstream.ObjectStoreConfig{
		Bucket: scheme.PayloadsBucket(), Description: "agentmesh envelopes above the server's max payload",
		TTL: PayloadTTL, Replicas: replicas,
	}
}

// Attempts bounds the tries of [Retry].
const Attempts = 32

// Retry runs one read-modify-write, try, until it returns anything but a
// lost compare-and-swap ([IsConflict]), and returns that. Between tries it
// waits a short random time that grows with the try, so writers that keep
// colliding drift apart. After [Attempts] lost tries it returns an error
// matching conflict and naming what; when ctx ends while it waits, ctx's
// error, wrapped with what.
func Retry(ctx context.Context, conflict error, what string, try func() error) error {
	for attempt := range Attempts {
		if attempt > 0 {
			if err := backoff(ctx, attempt); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
		}
		if err := try(); !IsConflict(err) {
			return err
		}
	}
	return fmt.Errorf("%w: %s: %d attempts lost to concurrent writers", conflict, what, Attempts)
}

// IsConflict reports whether err is a lost compare-and-swap: a revision
// mismatch, a create that found the key, or the raw "wrong last sequence"
// API error (10071, or 10164 on replicated streams).
func IsConflict(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// backoff waits a random time of up to attempt milliseconds (at most 20).
func backoff(ctx context.Context, attempt int) error {
	d := time.Duration(rand.Int64N(int64(min(attempt, 20))*int64(time.Millisecond))) + 1
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ttlFloor is the smallest per-key TTL the server accepts.
const ttlFloor = time.Second

// KeyTTL is the per-key TTL to ask for so a key lives at least d: the
// server keeps whole seconds of a TTL and drops the rest, so d is rounded
// up, to at least one second.
func KeyTTL(d time.Duration) time.Duration {
	return max((d + time.Second - 1).Truncate(time.Second), ttlFloor)
}
