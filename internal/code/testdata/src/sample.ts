// Größe: multi-byte text first (日本語).
export interface Shape {
  area(): number;
}

export type Id = string;

export enum Color { Red, Green }

export class Circle implements Shape {
  constructor(private r: number) {}

  area(): number {
    return Math.PI * this.r * this.r;
  }
}

export function total(shapes: Shape[]): number {
  return shapes.reduce((s, x) => s + x.area(), 0);
}

const double = (x: number) => x * 2;

export const VERSION = "1.0";

namespace Geo {
  export function origin() { return 0; }
}
