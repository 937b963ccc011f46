package main

import (
	"image/color"
	"os"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// plotSamples draws one panel per curve (time in seconds across), so a
// person sees at a glance whether anything grows.
func plotSamples(samples []sample, drivers map[string]string, path string) error {
	type curve struct {
		title, unit string
		y           func(s sample) float64
	}
	curves := []curve{
		{"supervisor RSS", "MiB", func(s sample) float64 { return mib(s.RSS) }},
		{"supervisor PSS", "MiB", func(s sample) float64 { return mib(s.PSS) }},
		{"open descriptors", "fds", func(s sample) float64 { return float64(s.FDs) }},
		{"goroutines", "count", func(s sample) float64 { return float64(s.Goroutines) }},
		{"holder processes", "count", func(s sample) float64 { return float64(s.Holders) }},
		{"SQLite WAL", "MiB", func(s sample) float64 { return mib(s.WAL) }},
		{"data directory", "MiB", func(s sample) float64 { return mib(s.DataDir) }},
	}
	var plots []*plot.Plot
	for _, c := range curves {
		p := plot.New()
		p.Title.Text = c.title
		p.X.Label.Text = "s"
		p.Y.Label.Text = c.unit
		p.Y.Min = 0
		pts := make(plotter.XYs, len(samples))
		for i, s := range samples {
			pts[i].X, pts[i].Y = s.T, c.y(s)
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		p.Add(l)
		plots = append(plots, p)
	}
	// Layers per sandbox, one line each.
	p := plot.New()
	p.Title.Text = "layers in head"
	p.X.Label.Text = "s"
	p.Y.Label.Text = "layers"
	var ids []string
	for id := range drivers {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	colors := []color.Color{color.RGBA{R: 200, A: 255}, color.RGBA{B: 200, A: 255}}
	for i, id := range ids {
		pts := make(plotter.XYs, len(samples))
		for j, s := range samples {
			pts[j].X, pts[j].Y = s.T, float64(s.Layers[id])
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = colors[i%len(colors)]
		p.Add(l)
		p.Legend.Add(drivers[id], l)
	}
	plots = append(plots, p)

	const cols = 2
	rows := (len(plots) + cols - 1) / cols
	grid := make([][]*plot.Plot, rows)
	for i := range grid {
		grid[i] = make([]*plot.Plot, cols)
		for j := range cols {
			if k := i*cols + j; k < len(plots) {
				grid[i][j] = plots[k]
			}
		}
	}
	img := vgimg.New(vg.Points(900), vg.Points(float64(260*rows)))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(grid, tiles, dc)
	for i := range grid {
		for j := range grid[i] {
			if grid[i][j] != nil {
				grid[i][j].Draw(canvases[i][j])
			}
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		return err
	}
	return f.Close()
}
