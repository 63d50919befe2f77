package ackmonitor_test

import (
	"bytes"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
)

// ackLoss dials connections that lose the client's acks a predicate
// picks on their way to the server: what a consumer leader change does to
// acks it had not replicated, on one server. Every other protocol
// operation passes unchanged and in order.
type ackLoss struct {
	// drop reports whether the ack published to subject
	// ($JS.ACK.<stream>.<consumer>.<delivery count>.<stream seq>...) is
	// lost.
	drop    func(subject string) bool
	dropped atomic.Int64
}

// Dial implements nats.CustomDialer.
func (l *ackLoss) Dial(network, address string) (net.Conn, error) {
	c, err := net.Dial(network, address)
	if err != nil {
		return nil, err
	}
	return &lossyConn{Conn: c, link: l}, nil
}

// lossyConn holds back the bytes of an operation until it is complete,
// then forwards it unless it is an ack its link drops.
type lossyConn struct {
	net.Conn
	link *ackLoss
	mu   sync.Mutex
	buf  []byte
}

func (c *lossyConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf = append(c.buf, p...)
	var out []byte
	for {
		n, drop := c.nextOp()
		if n == 0 {
			break
		}
		if !drop {
			out = append(out, c.buf[:n]...)
		}
		c.buf = c.buf[n:]
	}
	if len(out) > 0 {
		if _, err := c.Conn.Write(out); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// nextOp returns the length of the complete operation at the start of
// c.buf (0: incomplete) and whether it is a dropped ack: a PUB of "+ACK"
// (or an empty body) to a subject the link drops.
func (c *lossyConn) nextOp() (int, bool) {
	end := bytes.Index(c.buf, []byte("\r\n"))
	if end < 0 {
		return 0, false
	}
	line := c.buf[:end]
	fields := bytes.Fields(line)
	if len(fields) < 3 {
		return end + 2, false
	}
	var size int
	switch string(bytes.ToUpper(fields[0])) {
	case "PUB", "HPUB":
		n, err := strconv.Atoi(string(fields[len(fields)-1]))
		if err != nil {
			return end + 2, false
		}
		size = n
	default:
		return end + 2, false
	}
	total := end + 2 + size + 2
	if len(c.buf) < total {
		return 0, false
	}
	body := c.buf[end+2 : end+2+size]
	isAck := string(bytes.ToUpper(fields[0])) == "PUB" && (len(body) == 0 || string(body) == "+ACK")
	if isAck && c.link.drop(string(fields[1])) {
		c.link.dropped.Add(1)
		return total, true
	}
	return total, false
}
