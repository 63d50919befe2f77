package auth_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/agentmesh-io/agentmesh/agentkit"
	"github.com/agentmesh-io/agentmesh/auth"
	"github.com/agentmesh-io/agentmesh/internal/natstest"
)

// testPKI is a CA with one server and one client certificate.
type testPKI struct {
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
