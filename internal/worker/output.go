package worker

import (
	"github.com/klbr-dev/klbr/internal/artifacts"
)

// Default output bounds per execution (docs/worker-protocol.md).
const (
	DefaultPreviewBytes  = 64 << 10
	DefaultPreviewFrames = 1000
)

// OutputChunk is one piece of captured output.
type OutputChunk struct {
	Stream string `json:"stream"`         // stdout or stderr
	Origin string `json:"origin"`         // execution or task
	Task   string `json:"task,omitempty"` // the task's name, for origin task
	Data   string `json:"data"`
}

// Output is an execution's output as recorded: a bounded preview and, when
// the output was larger, the artifact holding all of it.
type Output struct {
	Preview       []OutputChunk  `json:"preview"`
	TotalBytes    int64          `json:"total_bytes"`
	TotalFrames   int            `json:"total_frames"`
	OmittedBytes  int64          `json:"omitted_bytes"`  // left out of the preview
	OmittedFrames int            `json:"omitted_frames"` // left out of the preview
	Artifact      *artifacts.Ref `json:"artifact,omitempty"`
	SpoolError    string         `json:"spool_error,omitempty"` // the artifact could not be written
}

// collector bounds one execution's output. Everything it is given ends up
// in the preview or, once the preview is full, in a spool that holds the
// whole output in order (preview included), committed as an artifact.
type collector struct {
	maxBytes  int
	maxFrames int
	store     *artifacts.Store
	out       Output
	previewed int
	spool     *artifacts.Spool
	spoolErr  error
}

func newCollector(store *artifacts.Store, maxBytes, maxFrames int) *collector {
	return &collector{store: store, maxBytes: maxBytes, maxFrames: maxFrames, out: Output{Preview: []OutputChunk{}}}
}

func (c *collector) add(ch OutputChunk) {
	c.out.TotalBytes += int64(len(ch.Data))
	c.out.TotalFrames++
	if c.spool == nil && c.spoolErr == nil &&
		c.previewed+len(ch.Data) <= c.maxBytes && len(c.out.Preview) < c.maxFrames {
		c.out.Preview = append(c.out.Preview, ch)
		c.previewed += len(ch.Data)
		return
	}
	c.out.OmittedBytes += int64(len(ch.Data))
	c.out.OmittedFrames++
	c.spoolWrite(ch.Data)
}

func (c *collector) spoolWrite(data string) {
	if c.spoolErr != nil {
		return
	}
	if c.spool == nil {
		if c.store == nil {
			c.spoolErr = errNoArtifactStore
			return
		}
		sp, err := c.store.NewSpool()
		if err != nil {
			c.spoolErr = err
			return
		}
		c.spool = sp
		for _, p := range c.out.Preview {
			if _, err := sp.Write([]byte(p.Data)); err != nil {
				c.spoolErr = err
				return
			}
		}
	}
	if _, err := c.spool.Write([]byte(data)); err != nil {
		c.spoolErr = err
	}
}

// finish commits the spool, if any, and returns the record of the output.
func (c *collector) finish() Output {
	if c.spool != nil && c.spoolErr == nil {
		ref, err := c.spool.Commit()
		if err != nil {
			c.spoolErr = err
		} else {
			c.out.Artifact = &ref
		}
	} else if c.spool != nil {
		c.spool.Discard()
	}
	if c.spoolErr != nil {
		c.out.SpoolError = c.spoolErr.Error()
	}
	return c.out
}
