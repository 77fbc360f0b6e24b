// Copyright gputally authors
// SPDX-License-Identifier: Apache-2.0

package gputallyprocessor // import "github.com/gputally/gputally/collector/gputallyprocessor"

import (
	"context"
	"sync"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/config/configgrpc"
	"google.golang.org/grpc"
)

// Receive windows: static and large, as gputally's own (a 4 MiB stream, a 16 MiB connection).
// Every call's answer is a whole batch, so grpc-go's default 64 KiB dynamic window would send
// a WINDOW_UPDATE and a BDP ping for about every answer, each one more frame for gputally to
// read and (the ping) answer; with these, a connection sees one WINDOW_UPDATE per 4 MiB read.
const (
	streamWindow = 4 << 20
	connWindow   = 16 << 20
)

// connections hands the pipelines that list one processor ID one gRPC connection, as the
// Collector's receivers share one server among pipelines: keyed by the ID's *Config, which
// the Collector passes to each of its pipelines' instances. The first instance to start opens
// it, the last to shut down closes it.
type connections struct {
	mu    sync.Mutex
	byCfg map[*Config]*sharedConn
}

type sharedConn struct {
	conn  *grpc.ClientConn
	users int
}

func newConnections() *connections {
	return &connections{byCfg: map[*Config]*sharedConn{}}
}

func (c *connections) acquire(ctx context.Context, cfg *Config, host component.Host, set component.TelemetrySettings) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if shared, ok := c.byCfg[cfg]; ok {
		shared.users++
		return shared.conn, nil
	}
	conn, err := cfg.ClientConfig.ToClientConn(ctx, host.GetExtensions(), set,
		configgrpc.WithGrpcDialOption(grpc.WithInitialWindowSize(streamWindow)),
		configgrpc.WithGrpcDialOption(grpc.WithInitialConnWindowSize(connWindow)))
	if err != nil {
		return nil, err
	}
	c.byCfg[cfg] = &sharedConn{conn: conn, users: 1}
	return conn, nil
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
	return shared.conn.Close()
}
