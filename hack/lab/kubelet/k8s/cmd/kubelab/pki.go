package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// PKI is the lab cluster's credentials: a CA, kube-apiserver's serving
// certificate signed by it, the service-account signing key, and one
// bearer token per client (kube-apiserver --token-auth-file). ECDSA P-256
// throughout: key generation is cheap even under TCG.
type PKI struct {
	Dir          string
	CACert       []byte // PEM
	AdminToken   string
	KubeletToken string
}

// Files of Dir, as kube-apiserver and kubelet are pointed at them.
const (
	caFile           = "ca.crt"
	apiserverCrtFile = "apiserver.crt"
	apiserverKeyFile = "apiserver.key"
	saKeyFile        = "sa.key"
	saPubFile        = "sa.pub"
	tokensFile       = "tokens.csv"
)

// newPKI writes a fresh PKI into dir for an apiserver reachable at ips
// and the in-cluster service names.
func newPKI(dir string, ips []net.IP) (*PKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "pathmend-lab-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(48 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(48 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  ips,
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	p := &PKI{Dir: dir, CACert: pemBlock("CERTIFICATE", caDER)}
	if p.AdminToken, err = token(); err != nil {
		return nil, err
	}
	if p.KubeletToken, err = token(); err != nil {
		return nil, err
	}
	srvKeyDER, err := x509.MarshalPKCS8PrivateKey(srvKey)
	if err != nil {
		return nil, err
	}
	saKeyDER, err := x509.MarshalPKCS8PrivateKey(saKey)
	if err != nil {
		return nil, err
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	// token,user,uid,"group1,group2"
	tokens := fmt.Sprintf("%s,lab-admin,lab-admin,\"system:masters\"\n%s,system:node:%s,kubelet-%s,\"system:nodes\"\n",
		p.AdminToken, p.KubeletToken, nodeName, nodeName)
	for name, data := range map[string][]byte{
		caFile:           p.CACert,
		apiserverCrtFile: pemBlock("CERTIFICATE", srvDER),
		apiserverKeyFile: pemBlock("PRIVATE KEY", srvKeyDER),
		saKeyFile:        pemBlock("PRIVATE KEY", saKeyDER),
		saPubFile:        pemBlock("PUBLIC KEY", saPubDER),
		tokensFile:       []byte(tokens),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Path is the path of one of the PKI's files.
func (p *PKI) Path(name string) string { return filepath.Join(p.Dir, name) }

// Kubeconfig is a kubeconfig for server with the lab CA and a bearer token.
func (p *PKI) Kubeconfig(server, user, token string) []byte {
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: lab
  context: {cluster: lab, user: %s}
current-context: lab
`, server, p.Path(caFile), user, token, user)
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func token() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}
