// Copyright gputally authors
// SPDX-License-Identifier: Apache-2.0

//go:generate mdatagen metadata.yaml

// Package gputallyprocessor is a Collector processor that hands each batch to gputally's
// bridge (proto/bridge in the gputally repository: one unary gRPC call per batch), which runs
// one of its pipelines on it, and continues the Collector's pipeline with the answer.
package gputallyprocessor // import "github.com/gputally/gputally/collector/gputallyprocessor"

import (
	"context"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/config/configgrpc"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/processorhelper"

	"github.com/gputally/gputally/collector/gputallyprocessor/internal/metadata"
)

// componentType is the processor's type, generated from metadata.yaml (with its stability).
var componentType = metadata.Type

const (
	defaultTimeout           = 5 * time.Second
	defaultMaxMessageSizeMiB = 64
)

// NewFactory returns the factory of the `gputally` processor.
func NewFactory() processor.Factory {
	f := &factory{conns: newConnections()}
	return processor.NewFactory(
		componentType,
		createDefaultConfig,
		processor.WithMetrics(f.createMetrics, metadata.MetricsStability),
		processor.WithLogs(f.createLogs, metadata.LogsStability),
		processor.WithTraces(f.createTraces, metadata.TracesStability),
	)
}

// factory holds what the instances it creates share: their processor IDs' connections.
type factory struct {
	conns *connections
}

func createDefaultConfig() component.Config {
	return &Config{
		ClientConfig:      configgrpc.NewDefaultClientConfig(),
		Timeout:           defaultTimeout,
		OnError:           OnErrorPass,
		AcceptPatch:       true,
		Connections:       1,
		MaxMessageSizeMiB: defaultMaxMessageSizeMiB,
	}
}

// capabilities: a patch answer changes the batch in place, so with accept_patch the processor
// mutates data (a fan-out before it copies); a whole-batch answer is a new batch and leaves
// the input alone.
func capabilities(cfg *Config) processorhelper.Option {
	return processorhelper.WithCapabilities(consumer.Capabilities{MutatesData: cfg.AcceptPatch})
}

func (f *factory) createMetrics(ctx context.Context, set processor.Settings, cfg component.Config, next consumer.Metrics) (processor.Metrics, error) {
	b, err := newBridge(set, cfg.(*Config), f.conns)
	if err != nil {
		return nil, err
	}
	return processorhelper.NewMetrics(ctx, set, cfg, next, b.processMetrics,
		processorhelper.WithStart(b.start), processorhelper.WithShutdown(b.shutdown), capabilities(b.cfg))
}

func (f *factory) createLogs(ctx context.Context, set processor.Settings, cfg component.Config, next consumer.Logs) (processor.Logs, error) {
	b, err := newBridge(set, cfg.(*Config), f.conns)
	if err != nil {
		return nil, err
	}
	return processorhelper.NewLogs(ctx, set, cfg, next, b.processLogs,
		processorhelper.WithStart(b.start), processorhelper.WithShutdown(b.shutdown), capabilities(b.cfg))
}

func (f *factory) createTraces(ctx context.Context, set processor.Settings, cfg component.Config, next consumer.Traces) (processor.Traces, error) {
	b, err := newBridge(set, cfg.(*Config), f.conns)
	if err != nil {
		return nil, err
	}
	return processorhelper.NewTraces(ctx, set, cfg, next, b.processTraces,
		processorhelper.WithStart(b.start), processorhelper.WithShutdown(b.shutdown), capabilities(b.cfg))
}
