// Copyright gputally authors
// SPDX-License-Identifier: Apache-2.0

package gputallyprocessor

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumererror"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/processor/processortest"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

func TestEverySignalGoesThroughTheBridge(t *testing.T) {
	for _, signal := range signals {
		t.Run(signal, func(t *testing.T) {
			fake, addr := startBridge(t, labelPods)
			p := newPipe(t, signal, testConfig(addr))

			require.NoError(t, p.consume(context.Background(), 2))

			delivered := p.delivered()
			require.Len(t, delivered, 2)
			for _, attrs := range delivered {
				pod, ok := attrs.Get(podKey)
				require.True(t, ok, "the bridge's attribute did not arrive downstream")
				assert.Equal(t, podName, pod.Str())
			}
			assert.Equal(t, []string{"bridge"}, fake.seen())
			assert.Equal(t, int64(1), p.sum(t, "otelcol_processor_gputally_calls", map[string]string{"signal": signal, "outcome": "ok"}))
			duration, err := p.tel.GetMetric("otelcol_processor_gputally_call_duration")
			require.NoError(t, err)
			assert.Equal(t, uint64(1), duration.Data.(metricdata.Histogram[float64]).DataPoints[0].Count)
		})
	}
}

func TestPartialDropIsCounted(t *testing.T) {
	dropSecond := func(_ context.Context, signal, _ string, otlp []byte) (reply, error) {
		out := editResources(signal, otlp, func(attrs pcommon.Map) bool {
			name, _ := attrs.Get("name")
			return name.Str() != "r1"
		})
		return reply{otlp: out, droppedItems: 1, errorMessage: "r1 is not a GPU workload"}, nil
	}
	for _, signal := range signals {
		t.Run(signal, func(t *testing.T) {
			_, addr := startBridge(t, dropSecond)
			p := newPipe(t, signal, testConfig(addr))

			require.NoError(t, p.consume(context.Background(), 3))

			var names []string
			for _, attrs := range p.delivered() {
				name, _ := attrs.Get("name")
				names = append(names, name.Str())
			}
			assert.Equal(t, []string{"r0", "r2"}, names)
			assert.Equal(t, int64(1), p.sum(t, "otelcol_processor_gputally_dropped_items", map[string]string{"signal": signal, "reason": "pipeline"}))
		})
	}
}

func TestEmptyAnswerDropsTheWholeBatch(t *testing.T) {
	dropAll := func(context.Context, string, string, []byte) (reply, error) { return reply{}, nil }
	for _, signal := range signals {
		t.Run(signal, func(t *testing.T) {
			_, addr := startBridge(t, dropAll)
			p := newPipe(t, signal, testConfig(addr))

			require.NoError(t, p.consume(context.Background(), 3), "an empty answer is not an error upstream")

			assert.Empty(t, p.delivered())
			assert.Equal(t, int64(3), p.sum(t, "otelcol_processor_gputally_dropped_items", map[string]string{"reason": "pipeline"}))
			assert.Equal(t, int64(1), p.sum(t, "otelcol_processor_gputally_calls", map[string]string{"outcome": "dropped_all"}))
		})
	}
}

func TestServerDownUnderEachOnError(t *testing.T) {
	for _, signal := range signals {
		t.Run(signal+"/pass", func(t *testing.T) {
			p := newPipe(t, signal, testConfig(closedAddress(t)))

			require.NoError(t, p.consume(context.Background(), 2))

			delivered := p.delivered()
			require.Len(t, delivered, 2, "on_error pass sends the batch on")
			_, labelled := delivered[0].Get(podKey)
			assert.False(t, labelled)
			assert.Equal(t, int64(2), p.sum(t, "otelcol_processor_gputally_passed_items", map[string]string{"signal": signal}))
			assert.Equal(t, int64(1), p.sum(t, "otelcol_processor_gputally_errors", map[string]string{"code": "Unavailable"}))
			assert.Equal(t, int64(1), p.sum(t, "otelcol_processor_gputally_calls", map[string]string{"outcome": "error"}))
		})
		t.Run(signal+"/drop", func(t *testing.T) {
			cfg := testConfig(closedAddress(t))
			cfg.OnError = OnErrorDrop
			p := newPipe(t, signal, cfg)

			require.NoError(t, p.consume(context.Background(), 2))

			assert.Empty(t, p.delivered())
			assert.Equal(t, int64(2), p.sum(t, "otelcol_processor_gputally_dropped_items", map[string]string{"reason": "on_error"}))
			assert.Equal(t, int64(0), p.sum(t, "otelcol_processor_gputally_passed_items", nil))
		})
		t.Run(signal+"/fail", func(t *testing.T) {
			cfg := testConfig(closedAddress(t))
			cfg.OnError = OnErrorFail
			p := newPipe(t, signal, cfg)

			err := p.consume(context.Background(), 2)

			require.Error(t, err)
			assert.Equal(t, codes.Unavailable, status.Code(err))
			assert.False(t, consumererror.IsPermanent(err), "an unreachable bridge is worth a retry")
			assert.Empty(t, p.delivered())
		})
	}
}

// blockUntilDone is a bridge that never answers; it reports when its call context ends.
func blockUntilDone(ended chan<- error) handler {
	return func(ctx context.Context, _, _ string, _ []byte) (reply, error) {
		<-ctx.Done()
		ended <- ctx.Err()
		return reply{}, ctx.Err()
	}
}

func TestTimeoutEndsTheCall(t *testing.T) {
	ended := make(chan error, 1)
	_, addr := startBridge(t, blockUntilDone(ended))
	cfg := testConfig(addr)
	cfg.Timeout = 200 * time.Millisecond
	cfg.OnError = OnErrorFail
	p := newPipe(t, "metrics", cfg)

	start := time.Now()
	err := p.consume(context.Background(), 1)

	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
	assert.False(t, consumererror.IsPermanent(err))
	assert.Less(t, time.Since(start), 3*time.Second)
	select {
	case <-ended: // the deadline reached the server too
	case <-time.After(5 * time.Second):
		t.Fatal("the server's call context did not end")
	}
}

func TestCancelledContextEndsTheCallPromptly(t *testing.T) {
	ended := make(chan error, 1)
	_, addr := startBridge(t, blockUntilDone(ended))
	cfg := testConfig(addr)
	cfg.Timeout = time.Minute
	cfg.OnError = OnErrorFail
	p := newPipe(t, "logs", cfg)

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	err := p.consume(ctx, 1)

	assert.Equal(t, codes.Canceled, status.Code(err))
	assert.Less(t, time.Since(start), 3*time.Second, "a cancelled caller must not wait for the timeout")
	select {
	case serverErr := <-ended:
		assert.ErrorIs(t, serverErr, context.Canceled)
	case <-time.After(5 * time.Second):
		t.Fatal("the cancellation did not reach the server")
	}
}

func TestUnknownPipeline(t *testing.T) {
	notFound := func(_ context.Context, _, pipeline string, _ []byte) (reply, error) {
		return reply{}, status.Errorf(codes.NotFound, "no pipeline %q", pipeline)
	}
	t.Run("fail is permanent", func(t *testing.T) {
		_, addr := startBridge(t, notFound)
		cfg := testConfig(addr)
		cfg.OnError = OnErrorFail
		p := newPipe(t, "traces", cfg)

		err := p.consume(context.Background(), 1)

		assert.Equal(t, codes.NotFound, status.Code(err))
		assert.True(t, consumererror.IsPermanent(err), "retrying cannot create the pipeline")
		assert.Contains(t, err.Error(), `pipeline "bridge"`)
	})
	t.Run("pass sends the batch on", func(t *testing.T) {
		_, addr := startBridge(t, notFound)
		p := newPipe(t, "traces", testConfig(addr))

		require.NoError(t, p.consume(context.Background(), 1))

		assert.Len(t, p.delivered(), 1)
		assert.Equal(t, int64(1), p.sum(t, "otelcol_processor_gputally_errors", map[string]string{"code": "NotFound"}))
	})
}

func TestUndecodableAnswerIsPermanent(t *testing.T) {
	garbage := func(context.Context, string, string, []byte) (reply, error) {
		return reply{otlp: []byte{0xff, 0xff, 0xff}}, nil
	}
	_, addr := startBridge(t, garbage)
	cfg := testConfig(addr)
	cfg.OnError = OnErrorFail
	p := newPipe(t, "metrics", cfg)

	err := p.consume(context.Background(), 1)

	assert.Equal(t, codes.Internal, status.Code(err))
	assert.True(t, consumererror.IsPermanent(err))
}

// largeLogs is a batch whose encoding is over gRPC's 4 MiB default receive limit.
func largeLogs() plog.Logs {
	return testLogs(1, strings.Repeat("x", 4<<20+(512<<10)))
}

func TestBatchOverFourMiB(t *testing.T) {
	t.Run("passes with raised limits", func(t *testing.T) {
		var got int
		_, addr := startBridge(t, func(ctx context.Context, signal, pipeline string, otlp []byte) (reply, error) {
			got = len(otlp)
			return labelPods(ctx, signal, pipeline, otlp)
		}, bigMessages...)
		cfg := testConfig(addr)
		cfg.OnError = OnErrorFail // the answer itself must arrive, not the batch passed on
		sink := new(consumertest.LogsSink)
		proc, err := NewFactory().CreateLogs(context.Background(), processortest.NewNopSettings(componentType), cfg, sink)
		require.NoError(t, err)
		require.NoError(t, proc.Start(context.Background(), componenttest.NewNopHost()))
		defer func() { require.NoError(t, proc.Shutdown(context.Background())) }()

		require.NoError(t, proc.ConsumeLogs(context.Background(), largeLogs()))

		assert.Greater(t, got, 4<<20)
		require.Len(t, sink.AllLogs(), 1)
		rl := sink.AllLogs()[0].ResourceLogs().At(0)
		pod, _ := rl.Resource().Attributes().Get(podKey)
		assert.Equal(t, podName, pod.Str(), "the processed batch came back")
		assert.Len(t, rl.ScopeLogs().At(0).LogRecords().At(0).Body().Str(), 4<<20+(512<<10))
	})
	t.Run("a server at gRPC's default limit refuses it permanently", func(t *testing.T) {
		_, addr := startBridge(t, func(_ context.Context, _, _ string, otlp []byte) (reply, error) {
			return reply{otlp: otlp}, nil
		})
		cfg := testConfig(addr)
		cfg.OnError = OnErrorFail
		proc, err := NewFactory().CreateLogs(context.Background(), processortest.NewNopSettings(componentType), cfg, new(consumertest.LogsSink))
		require.NoError(t, err)
		require.NoError(t, proc.Start(context.Background(), componenttest.NewNopHost()))
		defer func() { require.NoError(t, proc.Shutdown(context.Background())) }()

		err = proc.ConsumeLogs(context.Background(), largeLogs())

		assert.Equal(t, codes.ResourceExhausted, status.Code(err))
		assert.True(t, consumererror.IsPermanent(err), "resending the same batch cannot fit")
	})
}

func TestCallAfterShutdownGoesThroughOnError(t *testing.T) {
	_, addr := startBridge(t, labelPods)
	cfg := testConfig(addr)
	cfg.OnError = OnErrorFail
	proc, err := NewFactory().CreateMetrics(context.Background(), processortest.NewNopSettings(componentType), cfg, new(consumertest.MetricsSink))
	require.NoError(t, err)
	require.NoError(t, proc.Start(context.Background(), componenttest.NewNopHost()))
	require.NoError(t, proc.Shutdown(context.Background()))

	err = proc.ConsumeMetrics(context.Background(), testMetrics(1))

	require.Error(t, err)
	assert.False(t, consumererror.IsPermanent(err))
}

// Batches in flight read the client while shutdown clears it, on other goroutines: under
// `go test -race` (make go-test) a plain field here is a reported data race.
func TestShutdownWhileBatchesAreInFlight(t *testing.T) {
	_, addr := startBridge(t, labelPods)
	proc, err := NewFactory().CreateMetrics(context.Background(), processortest.NewNopSettings(componentType), testConfig(addr), new(consumertest.MetricsSink))
	require.NoError(t, err)
	require.NoError(t, proc.Start(context.Background(), componenttest.NewNopHost()))
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				// on_error pass: calls before and after the shutdown alike go on without error
				assert.NoError(t, proc.ConsumeMetrics(context.Background(), testMetrics(1)))
			}
		}()
	}
	time.Sleep(5 * time.Millisecond)
	require.NoError(t, proc.Shutdown(context.Background()))
	require.NoError(t, proc.Shutdown(context.Background()), "a second shutdown is a no-op")
	wg.Wait()
}

// throttled is a bridge that pushes back: RESOURCE_EXHAUSTED, with RetryInfo when delay > 0.
func throttled(delay time.Duration) handler {
	return func(context.Context, string, string, []byte) (reply, error) {
		st := status.New(codes.ResourceExhausted, "refused, retry later")
		if delay > 0 {
			var err error
			st, err = st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
			must(err)
		}
		return reply{}, st.Err()
	}
}

func TestBackpressureCarriesItsRetryDelayUpstream(t *testing.T) {
	t.Run("with RetryInfo", func(t *testing.T) {
		_, addr := startBridge(t, throttled(3*time.Second))
		cfg := testConfig(addr)
		cfg.OnError = OnErrorFail
		p := newPipe(t, "metrics", cfg)

		err := p.consume(context.Background(), 1)

		require.Error(t, err)
		assert.False(t, consumererror.IsPermanent(err), "the server said when to retry")
		// What an OTLP receiver in front answers with (status.FromError finds the wrapped
		// status): the code and the server's delay, which the sender's retry then honours.
		st, ok := status.FromError(err)
		require.True(t, ok)
		assert.Equal(t, codes.ResourceExhausted, st.Code())
		require.Len(t, st.Details(), 1)
		info, ok := st.Details()[0].(*errdetails.RetryInfo)
		require.True(t, ok)
		assert.Equal(t, 3*time.Second, info.GetRetryDelay().AsDuration())
		assert.Empty(t, p.delivered())
	})
	t.Run("without RetryInfo", func(t *testing.T) {
		_, addr := startBridge(t, throttled(0))
		cfg := testConfig(addr)
		cfg.OnError = OnErrorFail
		p := newPipe(t, "metrics", cfg)

		err := p.consume(context.Background(), 1)

		assert.Equal(t, codes.ResourceExhausted, status.Code(err))
		assert.True(t, consumererror.IsPermanent(err), "OTLP: RESOURCE_EXHAUSTED without RetryInfo is not retried")
	})
	t.Run("pass", func(t *testing.T) {
		_, addr := startBridge(t, throttled(time.Second))
		p := newPipe(t, "metrics", testConfig(addr))

		require.NoError(t, p.consume(context.Background(), 1))

		assert.Len(t, p.delivered(), 1)
		assert.Equal(t, int64(1), p.sum(t, "otelcol_processor_gputally_errors", map[string]string{"code": "ResourceExhausted"}))
	})
}
