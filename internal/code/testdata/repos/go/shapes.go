// Package shapes measures rectangles (Größe: size).
package shapes

// Rect is a rectangle.
type Rect struct {
	W, H int
}

// Area is the rectangle's area.
func (r Rect) Area() int {
	return r.W + r.H
}

// Perimeter is the length around it.
func (r Rect) Perimeter() int {
	return 2 * (r.W + r.H)
}
