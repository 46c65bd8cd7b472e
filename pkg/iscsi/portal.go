package iscsi

import (
	"context"
	"fmt"
	"net"
	"sort"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/volume"
)

// Resolver looks up a host name's addresses. *net.Resolver satisfies it.
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
}

// PortalMatcher matches the portals sysfs shows (an IP address and a
// port) against volume endpoints, which may name a host. Each host name
// is resolved at most once per matcher, so a matcher lives for one call
// or one tick; it is not safe for concurrent use.
type PortalMatcher struct {
	ctx   context.Context
	r     Resolver
	cache map[string][]net.IP
}

// NewPortalMatcher returns a matcher resolving host names with r (none
// are resolved when r is nil) within ctx.
func NewPortalMatcher(ctx context.Context, r Resolver) *PortalMatcher {
	return &PortalMatcher{ctx: ctx, r: r, cache: map[string][]net.IP{}}
}

// Match reports whether the session portal addr:port is endpoint ep.
func (m *PortalMatcher) Match(ep volume.Endpoint, addr string, port int) bool {
	if int(ep.Port) != port {
		return false
	}
	ip := net.ParseIP(addr)
	if ip == nil {
		return ep.Host == addr // a host name in sysfs: only an exact match counts
	}
	for _, cand := range m.ips(ep.Host) {
		if cand.Equal(ip) {
			return true
		}
	}
	return false
}

// Session reports whether session s is to target iqn at endpoint ep.
func (m *PortalMatcher) Session(s Session, iqn string, ep volume.Endpoint) bool {
	addr, port, ok := s.Portal()
	return ok && s.TargetName == iqn && m.Match(ep, addr, port)
}

// ips returns the addresses of host: itself when it is an IP literal, its
// resolved addresses otherwise (none when resolution fails).
func (m *PortalMatcher) ips(host string) []net.IP {
	if ip := net.ParseIP(host); ip != nil {
		return []net.IP{ip}
	}
	if ips, ok := m.cache[host]; ok {
		return ips
	}
	var ips []net.IP
	if m.r != nil {
		addrs, err := m.r.LookupHost(m.ctx, host)
		if err != nil {
			klog.FromContext(m.ctx).V(4).Info("Portal host name did not resolve", "host", host, "err", err)
		}
		for _, a := range addrs {
			if ip := net.ParseIP(a); ip != nil {
				ips = append(ips, ip)
			}
		}
	}
	m.cache[host] = ips
	return ips
}

// ResolveEndpoint returns ep with its host replaced by one IP address, so
// node records, sysfs and the heal all name the portal the same way. IPv4
// addresses are preferred, then the resolver's order.
func ResolveEndpoint(ctx context.Context, r Resolver, ep volume.Endpoint) (volume.Endpoint, error) {
	if net.ParseIP(ep.Host) != nil {
		return ep, nil
	}
	if r == nil {
		return volume.Endpoint{}, fmt.Errorf("portal %s: no resolver for a host name", ep)
	}
	addrs, err := r.LookupHost(ctx, ep.Host)
	if err != nil {
		return volume.Endpoint{}, fmt.Errorf("resolve portal %s: %w", ep, err)
	}
	var ips []net.IP
	for _, a := range addrs {
		if ip := net.ParseIP(a); ip != nil {
			ips = append(ips, ip)
		}
	}
	if len(ips) == 0 {
		return volume.Endpoint{}, fmt.Errorf("resolve portal %s: no address", ep)
	}
	sort.SliceStable(ips, func(i, j int) bool { return ips[i].To4() != nil && ips[j].To4() == nil })
	return volume.Endpoint{Host: ips[0].String(), Port: ep.Port}, nil
}
