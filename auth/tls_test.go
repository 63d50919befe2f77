package auth_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/auth"
	"github.com/agentmesh-io/agentmesh/config"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// testPKI is a CA with one server and one client certificate.
type testPKI struct {
	ca     *x509.Certificate
	pool   *x509.CertPool
	server tls.Certificate
	client tls.Certificate
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "agentmesh test CA"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(serial int64, cn string, usage x509.ExtKeyUsage, ips []net.IP) tls.Certificate {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: ips, DNSNames: []string{"localhost"},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return testPKI{
		ca:     ca,
		pool:   pool,
		server: issue(2, "nats", x509.ExtKeyUsageServerAuth, []net.IP{net.IPv4(127, 0, 0, 1)}),
		client: issue(3, "agent", x509.ExtKeyUsageClientAuth, nil),
	}
}

// TestTLS runs two isolated agents over TLS with verified client
// certificates and nkey credentials on top.
func TestTLS(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	b := generate(t, []auth.AgentSpec{{ID: "A"}, {ID: "B"}}, auth.Options{})
	s := natstest.RunServer(t, withAuth(t, b), func(o *server.Options) {
		o.TLS, o.TLSVerify = true, true
		o.TLSTimeout = 5
		o.TLSConfig = &tls.Config{
			MinVersion:   tls.VersionTLS12,
			Certificates: []tls.Certificate{pki.server},
			ClientCAs:    pki.pool,
			ClientAuth:   tls.RequireAndVerifyClientCert,
		}
	})
	clientTLS := func(withCert bool) nats.Option {
		c := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pki.pool}
		if withCert {
			c.Certificates = []tls.Certificate{pki.client}
		}
		return nats.Secure(c)
	}
	provision(t, s, b, auth.ProvisionOptions{}, clientTLS(true))
	ncA, _ := conn(t, s, b, "A", clientTLS(true))
	ncB, _ := conn(t, s, b, "B", clientTLS(true))
	if !ncA.TLSRequired() {
		t.Fatal("connection A is not TLS")
	}
	got := make(chan string, 1)
	bAgent := isolatedAgent(t, ncB, "B")
	if err := bAgent.HandleFunc("ping", func(ctx context.Context, m *agentkit.Message) error {
		got <- m.Envelope.SenderID
		return m.Reply(ctx, "pong", nil)
	}); err != nil {
		t.Fatal(err)
	}
	aAgent := isolatedAgent(t, ncA, "A")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, ag := range []*agentkit.Agent{aAgent, bAgent} {
		if err := ag.Start(ctx); err != nil {
			t.Fatalf("Start %s: %v", ag.ID(), err)
		}
	}
	resp, err := aAgent.Request(ctx, "B", "ping", nil)
	if err != nil {
		t.Fatalf("Request over TLS: %v", err)
	}
	if resp.Action != "pong" || <-got != "A" {
		t.Fatalf("response %q", resp.Action)
	}

	// Without a client certificate, or without trusting the CA, no connection.
	opts, err := b.Agents()[0].Credentials.Options()
	if err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(s.ClientURL(), append(opts, clientTLS(false))...); err == nil {
		nc.Close()
		t.Fatal("connected without a client certificate")
	}
	if nc, err := nats.Connect(s.ClientURL(), append(opts, nats.Secure(&tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pki.client}}))...); err == nil {
		nc.Close()
		t.Fatal("connected without verifying the server")
	}
	// A valid certificate is not enough: the nkey is still required.
	if nc, err := nats.Connect(s.ClientURL(), clientTLS(true)); err == nil {
		nc.Close()
		t.Fatal("connected with a certificate but no nkey")
	}
}

// TestTLS_FromConfig connects agents the way programs do, from the shared
// configuration: an nkey seed file, a CA file, and a client certificate
// and key file (config.NATS.Connect).
func TestTLS_FromConfig(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	b := generate(t, []auth.AgentSpec{{ID: "A"}, {ID: "B"}}, auth.Options{})
	s := natstest.RunServer(t, withAuth(t, b), func(o *server.Options) {
		o.TLS, o.TLSVerify, o.TLSTimeout = true, true, 5
		o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pki.server},
			ClientCAs: pki.pool, ClientAuth: tls.RequireAndVerifyClientCert}
	})
	dir := t.TempDir()
	if err := b.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	writePEM := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	keyDER, err := x509.MarshalECPrivateKey(pki.client.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	caPath := writePEM("ca.pem", "CERTIFICATE", pki.ca.Raw)
	certPath := writePEM("client.pem", "CERTIFICATE", pki.client.Certificate[0])
	keyPath := writePEM("client-key.pem", "EC PRIVATE KEY", keyDER)
	provision(t, s, b, auth.ProvisionOptions{}, nats.Secure(&tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pki.pool, Certificates: []tls.Certificate{pki.client}}))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	agents := map[string]*agentkit.Agent{}
	for _, id := range []string{"A", "B"} {
		cfg := config.Default()
		cfg.NATS.URLs = []string{s.ClientURL()}
		cfg.NATS.NKeySeed = filepath.Join(dir, id+".nk")
		cfg.NATS.TLS.CA, cfg.NATS.TLS.Cert, cfg.NATS.TLS.Key = caPath, certPath, keyPath
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		nc, err := cfg.NATS.Connect(ctx, nats.CustomInboxPrefix(auth.InboxPrefix(id)))
		if err != nil {
			t.Fatalf("connect %s from config: %v", id, err)
		}
		t.Cleanup(nc.Close)
		if !nc.TLSRequired() {
			t.Fatalf("%s is not on TLS", id)
		}
		agents[id] = isolatedAgent(t, nc, id)
	}
	if err := agents["B"].HandleFunc("ping", func(ctx context.Context, m *agentkit.Message) error { return m.Reply(ctx, "pong", nil) }); err != nil {
		t.Fatal(err)
	}
	for _, ag := range agents {
		if err := ag.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if resp, err := agents["A"].Request(ctx, "B", "ping", nil); err != nil || resp.Action != "pong" {
		t.Fatalf("Request: %v %v", resp, err)
	}
}
