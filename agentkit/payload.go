package agentkit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentmesh-io/agentmesh/agentkit/bucket"
	"github.com/agentmesh-io/agentmesh/agentkit/wire"
	"github.com/agentmesh-io/agentmesh/internal/bound"
)

// headerRoom is left under the server's max payload for headers.
const headerRoom = 4 << 10

// payloadStore is the object store of large envelopes, opened lazily,
// once: the send side offloads envelopes to it, the receive side claims
// and releases them.
type payloadStore struct {
	js        jetstream.JetStream
	cfg       jetstream.ObjectStoreConfig
	provision bool // create the bucket if missing (see WithProvisioning)

	mu    sync.Mutex
	store jetstream.ObjectStore
}

func newPayloadStore(js jetstream.JetStream, o *options) payloadStore {
	return payloadStore{js: js, cfg: bucket.Payloads(o.scheme, o.replicas), provision: o.provision}
}

// open returns the store, opening it on first use.
func (p *payloadStore) open(ctx context.Context) (jetstream.ObjectStore, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.store != nil {
		return p.store, nil
	}
	s, err := bucket.ObjectStore(ctx, p.js, p.cfg, p.provision)
	if err != nil {
		return nil, fmt.Errorf("agentkit: payload store: %w", err)
	}
	p.store = s
	return s, nil
}

// offload stores the encoded envelope data in the object store and returns
// the stub envelope to publish in its place.
func (s *sender) offload(ctx context.Context, e *wire.Envelope, data []byte) ([]byte, error) {
	if len(data) > s.opts.maxEnvelope {
		return nil, fmt.Errorf("%w: %d bytes, receivers accept %d", ErrPayloadTooLarge, len(data), s.opts.maxEnvelope)
	}
	stub, err := stub(e).Encode() // before the store, so a stub that fails leaves nothing behind
	if err != nil {
		return nil, err
	}
	store, err := s.objects.open(ctx)
	if err != nil {
		return nil, err
	}
	// Chunks must fit the server's max payload, which may be below the
	// client's default chunk size (128 KiB), with room for the headers.
	chunk := uint32(min(128<<10, max(s.nc.MaxPayload()-1024, 1024)))
	meta := jetstream.ObjectMeta{Name: e.MessageID, Opts: &jetstream.ObjectMetaOptions{ChunkSize: chunk}}
	if _, err := store.Put(ctx, meta, bytes.NewReader(data)); err != nil {
		return nil, fmt.Errorf("agentkit: store large envelope %s: %w", e.MessageID, err)
	}
	return stub, nil
}

// stub returns e without the fields that can be large: payload, context,
// metadata and the error's message and details. An error envelope keeps
// its error's code, which validation requires.
func stub(e *wire.Envelope) *wire.Envelope {
	s := *e
	s.Payload, s.Context, s.Metadata, s.Error = nil, nil, nil, nil
	if e.Error != nil {
		s.Error = &wire.Error{Code: e.Error.Code, Retryable: e.Error.Retryable, RetryAfterMS: e.Error.RetryAfterMS}
	}
	return &s
}

// checkRef returns why ref, a message's HeaderEnvelopeRef, cannot name its
// large envelope, or "". The sender names the object after the message's
// message_id, so a ref is exactly the Nats-Msg-Id header, or for a dead
// letter's replay the message id its Nats-Msg-Id was made from
// (wire.ReplayOf); anything else (a ref long enough to make the object's
// subject exceed the server's control line would have the server close
// the connection) is refused unread.
func checkRef(ref, msgID string) string {
	if orig, _ := wire.ReplayOf(msgID); ref != msgID && ref != orig {
		return fmt.Sprintf("%s %s is not the message's %s %s", wire.HeaderEnvelopeRef, bound.Quote(ref), wire.HeaderMsgID, bound.Quote(msgID))
	}
	if err := wire.ValidateMessageID(ref); err != nil {
		return wire.HeaderEnvelopeRef + ": " + err.Error()
	}
	return ""
}

// claim replaces a stub envelope by the full one from the object store.
// It returns a reason to terminate the message, or a retryable error.
// Only what may pass (the store unreachable, a timeout) is retried: an
// object the sender made wrong (missing, a link, bad metadata, a digest
// that does not match, too large) never will be right. Links are refused
// unread, as following one could leave the bucket or loop.
func (r *receiver) claim(ref string) (*wire.Envelope, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), r.opts.publishTimeout)
	defer cancel()
	store, err := r.objects.open(ctx)
	if err != nil {
		return nil, "", err
	}
	info, err := store.GetInfo(ctx, ref)
	if reason := objectFault(ref, err); reason != "" {
		return nil, reason, nil
	}
	switch {
	case err != nil:
		return nil, "", err
	case info.Opts != nil && info.Opts.Link != nil:
		return nil, fmt.Sprintf("large envelope %s is a link; only objects are accepted", bound.Quote(ref)), nil
	case info.Size > uint64(r.opts.maxEnvelope):
		return nil, fmt.Sprintf("envelope of %d bytes exceeds the %d byte limit", info.Size, r.opts.maxEnvelope), nil
	}
	obj, err := store.Get(ctx, ref)
	if reason := objectFault(ref, err); reason != "" {
		return nil, reason, nil
	}
	if err != nil {
		return nil, "", err
	}
	defer obj.Close()
	// The metadata's size is the sender's word: read no more than allowed.
	data, err := io.ReadAll(io.LimitReader(obj, int64(r.opts.maxEnvelope)+1))
	if reason := objectFault(ref, err); reason != "" {
		return nil, reason, nil
	}
	if err != nil {
		return nil, "", err
	}
	if len(data) > r.opts.maxEnvelope {
		return nil, fmt.Sprintf("envelope of more than %d bytes exceeds the limit", r.opts.maxEnvelope), nil
	}
	env, err := wire.Decode(data)
	if err != nil {
		return nil, err.Error(), nil
	}
	if env.MessageID != ref { // checkRef tied ref to the message's Nats-Msg-Id
		return nil, fmt.Sprintf("large envelope %s has message_id %s", bound.Quote(ref), bound.Quote(env.MessageID)), nil
	}
	return env, "", nil
}

// objectFault returns why the object store's err means the object ref is
// wrong for good, or "" when err is nil or may pass.
func objectFault(ref string, err error) string {
	switch {
	case errors.Is(err, jetstream.ErrObjectNotFound):
		return fmt.Sprintf("large envelope %s is no longer in the payload store", bound.Quote(ref))
	case errors.Is(err, jetstream.ErrBadObjectMeta), errors.Is(err, jetstream.ErrCantGetBucket):
		return fmt.Sprintf("large envelope %s: the object's metadata is not valid", bound.Quote(ref))
	case errors.Is(err, jetstream.ErrDigestMismatch):
		return fmt.Sprintf("large envelope %s does not match its digest", bound.Quote(ref))
	}
	return ""
}

// release deletes the offloaded envelope of a direct message once acked;
// topic and broadcast copies are left to the bucket's TTL because other
// subscribers may still need them, and so is the object of a replay,
// which is the original message's (another replay may need it).
func (r *receiver) release(d *delivery) {
	ref := d.msg.Headers().Get(wire.HeaderEnvelopeRef)
	if ref == "" || d.subject.Kind != "agent" || ref != d.msg.Headers().Get(wire.HeaderMsgID) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.opts.attemptTimeout)
	defer cancel()
	store, err := r.objects.open(ctx)
	if err == nil {
		err = store.Delete(ctx, ref)
	}
	if err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		r.asyncError(fmt.Errorf("agentkit: release large envelope %s: %w", ref, err))
	}
}
