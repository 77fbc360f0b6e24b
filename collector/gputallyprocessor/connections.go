// Copyright gputally authors
// SPDX-License-Identifier: Apache-2.0

package gputallyprocessor // import "github.com/gputally/gputally/collector/gputallyprocessor"

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/config/configgrpc"
	"google.golang.org/grpc"

	"github.com/gputally/gputally/collector/gputallyprocessor/internal/bridgepb"
)

// Receive windows: static and large, as gputally's own (a 4 MiB stream, a 16 MiB connection).
// Every call's answer is a whole batch, so grpc-go's default 64 KiB dynamic window would send
// a WINDOW_UPDATE and a BDP ping for about every answer, each one more frame for gputally to
// read and (the ping) answer; with these, a connection sees one WINDOW_UPDATE per 4 MiB read.
const (
	streamWindow = 4 << 20
	connWindow   = 16 << 20
)

// connections hands the pipelines that list one processor ID one pool of gRPC connections
// (`connections` of them, 1 by default), as the Collector's receivers share one server among
// pipelines: keyed by the ID's *Config, which the Collector passes to each of its pipelines'
// instances. The first instance to start opens it, the last to shut down closes it.
//
// Why a pool: gputally serves the bridge from one event loop per process, and `gputally serve
// --workers N` runs N processes behind one port (SO_REUSEPORT), which the kernel shares out
// by connection. On one connection every call goes to one process, one core, in a row; on
// N connections calls in flight spread over the workers (and over as many grpc-go readers
// and writers on this side).
type connections struct {
	mu    sync.Mutex
	byCfg map[*Config]*sharedConn
}

type sharedConn struct {
	pool  *pool
	users int
}

// pool is one processor ID's connections, and a counter that spreads calls over them.
type pool struct {
	conns   []*grpc.ClientConn
	clients []bridgepb.BridgeClient
	next    atomic.Uint32
}

// client is the next connection's client, round robin.
func (p *pool) client() bridgepb.BridgeClient {
	if len(p.clients) == 1 {
		return p.clients[0]
	}
	return p.clients[int(p.next.Add(1)-1)%len(p.clients)]
}

func (p *pool) close() error {
	var errs []error
	for _, conn := range p.conns {
		errs = append(errs, conn.Close())
	}
	return errors.Join(errs...)
}

func newConnections() *connections {
	return &connections{byCfg: map[*Config]*sharedConn{}}
}

func (c *connections) acquire(ctx context.Context, cfg *Config, host component.Host, set component.TelemetrySettings) (*pool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if shared, ok := c.byCfg[cfg]; ok {
		shared.users++
		return shared.pool, nil
	}
	p := &pool{}
	for range max(cfg.Connections, 1) {
		conn, err := cfg.ClientConfig.ToClientConn(ctx, host.GetExtensions(), set,
			configgrpc.WithGrpcDialOption(grpc.WithInitialWindowSize(streamWindow)),
			configgrpc.WithGrpcDialOption(grpc.WithInitialConnWindowSize(connWindow)))
		if err != nil {
			return nil, errors.Join(err, p.close())
		}
		p.conns = append(p.conns, conn)
		p.clients = append(p.clients, bridgepb.NewBridgeClient(conn))
	}
	c.byCfg[cfg] = &sharedConn{pool: p, users: 1}
	return p, nil
}

func (c *connections) release(cfg *Config) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	shared, ok := c.byCfg[cfg]
	if !ok {
		return nil
	}
	if shared.users--; shared.users > 0 {
		return nil
	}
	delete(c.byCfg, cfg)
	return shared.pool.close()
}
