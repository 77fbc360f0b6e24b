// Copyright gputally authors
// SPDX-License-Identifier: Apache-2.0

package gputallyprocessor

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/processor/processortest"
	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// frameCounter is a TCP proxy in front of a bridge that counts the connections it takes and
// the HTTP/2 frames the client sends on them, by type (PING acks aside), and forwards every
// byte both ways unchanged.
type frameCounter struct {
	mu          sync.Mutex
	connections int
	counts      map[http2.FrameType]int
}

func proxyCountingFrames(t *testing.T, target string) (*frameCounter, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = lis.Close() })
	fc := &frameCounter{counts: map[http2.FrameType]int{}}
	go func() {
		for {
			client, err := lis.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				_ = client.Close()
				return
			}
			t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
			fc.mu.Lock()
			fc.connections++
			fc.mu.Unlock()
			go func() { _, _ = io.Copy(client, server) }()
			go fc.read(io.TeeReader(client, server))
		}
	}()
	return fc, lis.Addr().String()
}

// read parses the client's side of one connection (preface, then frames) as it goes by.
func (fc *frameCounter) read(from io.Reader) {
	if _, err := io.ReadFull(from, make([]byte, len(http2.ClientPreface))); err != nil {
		return
	}
	framer := http2.NewFramer(nil, from)
	framer.SetMaxReadFrameSize(1 << 24)
	for {
		frame, err := framer.ReadFrame()
		if err != nil {
			return
		}
		if ping, ok := frame.(*http2.PingFrame); ok && ping.IsAck() {
			continue // the client's answers to the server's pings are the server's doing
		}
		fc.mu.Lock()
		fc.counts[frame.Header().Type]++
		fc.mu.Unlock()
	}
}

func (fc *frameCounter) accepted() int {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return fc.connections
}

func (fc *frameCounter) count(kind http2.FrameType) int {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return fc.counts[kind]
}

// Each answer is a whole batch. With grpc-go's default (a 64 KiB window, grown by BDP pings)
// the client would answer batches with BDP pings and WINDOW_UPDATEs, frames gputally has to
// read and (pings) answer on every call; the processor's static windows leave only the one
// WINDOW_UPDATE that opens the connection's window at the start.
func TestAnswersNeedNoFlowControlFrames(t *testing.T) {
	_, addr := startBridge(t, labelPods)
	frames, proxied := proxyCountingFrames(t, addr)
	cfg := testConfig(proxied)
	cfg.OnError = OnErrorFail // every answer must arrive, not the batch passed on
	sink := new(consumertest.LogsSink)
	proc, err := NewFactory().CreateLogs(context.Background(), processortest.NewNopSettings(componentType), cfg, sink)
	require.NoError(t, err)
	require.NoError(t, proc.Start(context.Background(), componenttest.NewNopHost()))
	defer func() { require.NoError(t, proc.Shutdown(context.Background())) }()

	for range 20 {
		require.NoError(t, proc.ConsumeLogs(context.Background(), testLogs(1, strings.Repeat("x", 100<<10))))
	}

	require.Len(t, sink.AllLogs(), 20)
	assert.Equal(t, 20, frames.count(http2.FrameHeaders), "one call per batch")
	assert.Zero(t, frames.count(http2.FramePing), "no BDP pings")
	assert.LessOrEqual(t, frames.count(http2.FrameWindowUpdate), 1, "2 MiB of answers within the 16 MiB window")
}

// The pipelines that list one processor ID share its connection; another ID has its own. The
// connection lasts until the last of its pipelines shuts down.
func TestPipelinesOfOneIDShareAConnection(t *testing.T) {
	_, addr := startBridge(t, labelPods)
	frames, proxied := proxyCountingFrames(t, addr)
	ctx, host := context.Background(), componenttest.NewNopHost()
	f, set := NewFactory(), processortest.NewNopSettings(componentType)
	cfg, other := testConfig(proxied), testConfig(proxied)
	cfg.OnError, other.OnError = OnErrorFail, OnErrorFail // every batch must reach the bridge

	metrics, err := f.CreateMetrics(ctx, set, cfg, consumertest.NewNop())
	require.NoError(t, err)
	logs, err := f.CreateLogs(ctx, set, cfg, consumertest.NewNop())
	require.NoError(t, err)
	separate, err := f.CreateMetrics(ctx, set, other, consumertest.NewNop())
	require.NoError(t, err)
	for _, p := range []component.Component{metrics, logs, separate} {
		require.NoError(t, p.Start(ctx, host))
		t.Cleanup(func() { _ = p.Shutdown(ctx) }) // a failed check still releases it (safe twice)
	}

	require.NoError(t, metrics.ConsumeMetrics(ctx, testMetrics(1)))
	require.NoError(t, logs.ConsumeLogs(ctx, testLogs(1, "")))
	require.NoError(t, separate.ConsumeMetrics(ctx, testMetrics(1)))
	assert.Equal(t, 2, frames.accepted(), "one connection for cfg's two pipelines, one for other's")

	require.NoError(t, metrics.Shutdown(ctx))
	require.NoError(t, metrics.Shutdown(ctx), "a second shutdown does not release the connection again")
	require.NoError(t, logs.ConsumeLogs(ctx, testLogs(1, "")), "logs still has the shared connection")
	assert.Equal(t, 2, frames.accepted())
	err = metrics.ConsumeMetrics(ctx, testMetrics(1))
	assert.Equal(t, codes.Unavailable, status.Code(err), "a shut-down instance has no connection")

	require.NoError(t, logs.Shutdown(ctx))
	require.NoError(t, separate.Shutdown(ctx))

	// After the last shutdown the ID opens a new connection when it starts again.
	again, err := f.CreateLogs(ctx, set, cfg, consumertest.NewNop())
	require.NoError(t, err)
	require.NoError(t, again.Start(ctx, host))
	t.Cleanup(func() { _ = again.Shutdown(ctx) })
	require.NoError(t, again.ConsumeLogs(ctx, testLogs(1, "")))
	require.NoError(t, again.Shutdown(ctx))
	assert.Equal(t, 3, frames.accepted())
}

// With `connections: 3` the ID's pipelines share a pool of three, and calls go round robin
// over it: six calls open all three (grpc-go connects on first use).
func TestConnectionsArePooledAndCallsSpread(t *testing.T) {
	_, addr := startBridge(t, labelPods)
	frames, proxied := proxyCountingFrames(t, addr)
	ctx, host := context.Background(), componenttest.NewNopHost()
	f, set := NewFactory(), processortest.NewNopSettings(componentType)
	cfg := testConfig(proxied)
	cfg.OnError, cfg.Connections = OnErrorFail, 3

	metrics, err := f.CreateMetrics(ctx, set, cfg, consumertest.NewNop())
	require.NoError(t, err)
	logs, err := f.CreateLogs(ctx, set, cfg, consumertest.NewNop())
	require.NoError(t, err)
	for _, p := range []component.Component{metrics, logs} {
		require.NoError(t, p.Start(ctx, host))
		t.Cleanup(func() { _ = p.Shutdown(ctx) })
	}
	for range 3 {
		require.NoError(t, metrics.ConsumeMetrics(ctx, testMetrics(1)))
		require.NoError(t, logs.ConsumeLogs(ctx, testLogs(1, "")))
	}

	assert.Equal(t, 3, frames.accepted(), "one pool of three for the ID's two pipelines")
	require.NoError(t, metrics.Shutdown(ctx))
	require.NoError(t, logs.Shutdown(ctx))
}
