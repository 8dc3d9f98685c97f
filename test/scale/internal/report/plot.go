package report

import (
	"image/color"
	"io"
	"math"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/sli"
	"github.com/fdb-etcd/fdb-etcd/test/scale/internal/stores"
)

// panel is one chart of the figure: a value per sliding window.
type panel struct {
	title, unit string
	value       func(sli.Window) float64
}

func p99ms(key string) func(sli.Window) float64 {
	return func(w sli.Window) float64 { return 1000 * w.P99(key) }
}

var panels = []panel{
	{"mutating calls p99", "ms", p99ms(sli.MutatingAll)},
	{"GET p99", "ms", p99ms(sli.Get)},
	{"LIST p99, namespace scope", "ms", p99ms(sli.ListNamespace)},
	{"LIST p99, cluster scope", "ms", p99ms(sli.ListCluster)},
	{"ConfigMap create -> informer p99 (harness)", "ms", func(w sli.Window) float64 { return 1000 * w.ProbeP99() }},
	{"store CPU", "cores", sli.Window.StoreCores},
}

// colors tell the stores apart, in the order of stores.Kinds.
var colors = []color.RGBA{{R: 0x33, G: 0x66, B: 0xcc, A: 0xff}, {R: 0xdd, G: 0x66, B: 0x11, A: 0xff}, {R: 0x22, G: 0x99, B: 0x44, A: 0xff}}

func colorOf(kind string) color.RGBA {
	for i, k := range stores.Kinds {
		if k == kind {
			return colors[i%len(colors)]
		}
	}
	return color.RGBA{A: 0xff}
}

// Plot draws every panel, one line per store, over the measured phase: at
// each sample, the value over the window of at least width ending there.
func Plot(w io.Writer, results []Result, width time.Duration) error {
	const cols = 2
	rows := (len(panels) + cols - 1) / cols
	grid := make([][]*plot.Plot, rows)
	for i := range grid {
		grid[i] = make([]*plot.Plot, cols)
	}
	for i, pn := range panels {
		p, err := drawPanel(pn, results, width)
		if err != nil {
			return err
		}
		grid[i/cols][i%cols] = p
	}
	for i := len(panels); i < rows*cols; i++ {
		grid[i/cols][i%cols] = plot.New()
	}
	img := vgimg.New(vg.Length(cols)*7*vg.Inch, vg.Length(rows)*3.5*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(grid, tiles, dc)
	for i := range grid {
		for j := range grid[i] {
			grid[i][j].Draw(canvases[i][j])
		}
	}
	_, err := vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}

func drawPanel(pn panel, results []Result, width time.Duration) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = pn.title
	p.X.Label.Text = "minutes into the measured phase"
	p.Y.Label.Text = pn.unit
	p.Y.Min = 0
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	ymax := 0.0
	for _, r := range results {
		if !r.Measured() {
			continue
		}
		var pts plotter.XYs
		for _, win := range sli.Sliding(r.Samples[r.Start:r.End+1], width) {
			v := pn.value(win)
			if math.IsNaN(v) || math.IsInf(v, 0) {
				continue
			}
			pts = append(pts, plotter.XY{X: win.To.At.Minutes(), Y: v})
			ymax = max(ymax, v)
		}
		if len(pts) == 0 {
			continue
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return nil, err
		}
		line.Color = colorOf(r.Kind)
		line.Width = vg.Points(1.5)
		p.Add(line)
		p.Legend.Add(r.Title, line)
	}
	// Headroom above the lines for the legend.
	if ymax > 0 {
		p.Y.Max = 1.4 * ymax
	}
	return p, nil
}
