package agentkit

import (
	"sync"
)

// encodeBuffers recycles the buffers outgoing envelopes are encoded into
// with wire.Envelope.AppendJSON (see outMsg): a *[]byte each. Every send
// encodes one envelope, so reusing its buffer saves an allocation per send.
var encodeBuffers sync.Pool

// maxPooledBuffer bounds the buffers kept for reuse, so one huge envelope
// does not pin its buffer.
const maxPooledBuffer = 64 << 10

// getEncodeBuffer returns an empty-or-reused buffer from the pool.
func getEncodeBuffer() *[]byte {
	if b, ok := encodeBuffers.Get().(*[]byte); ok {
		return b
	}
	return new([]byte)
}

// putEncodeBuffer hands b back to the pool once nothing refers to its bytes.
func putEncodeBuffer(b *[]byte) {
	if b != nil && cap(*b) <= maxPooledBuffer {
		encodeBuffers.Put(b)
	}
}
